#!/usr/bin/env bash
# Halo in CUDA over sucl's C ABI (crates/sucl-capi/examples/cuda/halo.cu) on the GPU machine:
# `--path device` (sucl_sendrecv_device on the stream) beside `--path host` (pinned copies and
# sucl_sendrecv), alternating per round, under `sucl run -n R` for each R of RANKS (the ranks
# share the GPUs round robin). Prints a markdown table of the medians over rounds (ms per step,
# max over ranks), device/host, and the checks against the serial reference: ok, WRONG, or
# failed runs (see the logs); exits 1 unless all are ok.
#
# usage: [RANKS="2 4"] [ROUNDS=5] [SIZE=120] [STEPS=50] \
#        scripts/cuda-halo.sh --sucl PATH --lib DIR --halo PATH [--build --nvcc PATH] [--out DIR]
#   --sucl   the sucl launcher (target/release/sucl)
#   --lib    the directory holding libsucl.so.0 (put on LD_LIBRARY_PATH; --build links it)
#   --halo   the halo binary (written there with --build)
#   --build  compile halo.cu first: NVCC -O2 -arch=sm_90 ... LIB/libsucl.so.0 (seconds)
#   --nvcc   the nvcc to build with (default: nvcc on PATH)
#   --out    where logs go (default: a temporary directory, printed)
# example: scripts/cuda-halo.sh --sucl .dev/sucl --lib .dev/lib --halo .dev/halo --build
set -uo pipefail
usage() { sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; }
SUCL="" LIB="" HALO="" BUILD=0 NVCC=nvcc OUTDIR=""
while [ $# -gt 0 ]; do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --sucl) SUCL="$2"; shift 2 ;;
    --lib) LIB="$2"; shift 2 ;;
    --halo) HALO="$2"; shift 2 ;;
    --build) BUILD=1; shift ;;
    --nvcc) NVCC="$2"; shift 2 ;;
    --out) OUTDIR="$2"; shift 2 ;;
    *) echo "cuda-halo.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
for v in SUCL LIB HALO; do
  [ -n "${!v}" ] || { echo "cuda-halo.sh: missing --$(echo "$v" | tr 'A-Z' 'a-z')" >&2; exit 2; }
done
[ -e "$LIB/libsucl.so.0" ] || { echo "cuda-halo.sh: no libsucl.so.0 in $LIB" >&2; exit 2; }
LIB="$(cd "$LIB" && pwd)"
REPO="$(cd "$(dirname "$0")/.." && pwd)"
if [ "$BUILD" = 1 ]; then
  "$NVCC" -O2 -arch=sm_90 -std=c++17 -I "$REPO/crates/sucl-capi/include" "$REPO/crates/sucl-capi/examples/cuda/halo.cu" \
    -o "$HALO" -L "$LIB" -l:libsucl.so.0 || { echo "cuda-halo.sh: building halo.cu failed" >&2; exit 2; }
fi
[ -x "$SUCL" ] && [ -x "$HALO" ] || { echo "cuda-halo.sh: $SUCL or $HALO is not an executable" >&2; exit 2; }
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
export LD_LIBRARY_PATH="$LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
RANKS=${RANKS:-2 4}; ROUNDS=${ROUNDS:-5}; SIZE=${SIZE:-120}; STEPS=${STEPS:-50}
OUTDIR=${OUTDIR:-$(mktemp -d)}
mkdir -p "$OUTDIR"
echo "cuda-halo: logs in $OUTDIR" >&2
for round in $(seq 1 "$ROUNDS"); do
  for r in $RANKS; do
    for path in device host; do
      timeout 300 "$SUCL" run -n "$r" -- "$HALO" --size "$SIZE" --steps "$STEPS" --path "$path" >>"$OUTDIR/$path-$r" 2>&1 \
        || echo "cuda-halo: $path on $r ranks, round $round: exit $?" >>"$OUTDIR/$path-$r"
    done
  done
done
nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | sort | uniq -c | sed 's/^ */GPUs: /' || true
python3 - "$OUTDIR" "$RANKS" "$SIZE" "$STEPS" "$ROUNDS" <<'PY'
import re, statistics, sys
out, ranks, size, steps, rounds = sys.argv[1], sys.argv[2].split(), *sys.argv[3:]
def runs(name):
    text = open(f"{out}/{name}").read()
    ms = [float(x) for x in re.findall(r"([0-9.]+) ms/step", text)]
    checks = re.findall(r"check (\w+)", text)
    gpus = set(re.findall(r"ranks on (\d+) GPU", text))
    state = "WRONG" if "WRONG" in checks else "ok" if len(ms) == int(rounds) and checks == ["ok"] * len(ms) else "failed runs"
    return ms, state, ",".join(sorted(gpus))
print(f"Halo (CUDA, sucl C ABI): {size}^3 floats, {steps} timed steps, median of {rounds} rounds (ms per step, max over ranks)\n")
print("| ranks | GPUs | device ms | host ms | device/host | rounds (device; host) | checks |")
print("| --- | --- | --- | --- | --- | --- | --- |")
bad = False
for r in ranks:
    (d, d_state, g), (h, h_state, _) = runs(f"device-{r}"), runs(f"host-{r}")
    state = d_state if d_state != "ok" else h_state
    bad |= state != "ok"
    if not d or not h:
        print(f"| {r} | {g} | failed | | | | see logs |"); continue
    dm, hm = statistics.median(d), statistics.median(h)
    fmt = lambda v: " ".join(f"{x:.3f}" for x in v)
    print(f"| {r} | {g} | {dm:.3f} | {hm:.3f} | {dm / hm:.2f} | {fmt(d)}; {fmt(h)} | {state} |")
sys.exit(1 if bad else 0)
PY
