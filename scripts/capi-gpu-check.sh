#!/usr/bin/env bash
# GPU check of sucl's C API on device pointers, for the device machine: runs prebuilt binaries
# (nothing is built here) and fails — never skips — without 2 GPUs, the CUDA driver or NCCL.
#   1. crates/sucl-capi/examples/c/device.c on 2 ranks under `sucl run -n 2` (one GPU each):
#      every collective, all_gatherv, send/recv and sendrecv on a user-created stream and once on
#      the legacy default stream, checked against a serial reference, with 1048579 elements per
#      call (NCCL) and with 4099 (small: peer memory where the GPUs reach each other); a host
#      pointer passed to a call on device buffers must be refused. Every rank must print "0 wrong".
#   2. bad_input.c in one process: with a GPU present every _device call given host memory
#      returns SUCL_ERR_INVALID_ARGUMENT ("host memory").
#
# usage: scripts/capi-gpu-check.sh --sucl PATH --device PATH --bad-input PATH --lib DIR [--out DIR]
#   --sucl       the sucl launcher (target/release/sucl)
#   --device     device.c built against libsucl (gcc ... -lsucl)
#   --bad-input  bad_input.c built against libsucl
#   --lib        the directory holding libsucl.so.0 (put on LD_LIBRARY_PATH)
#   --out        where logs go (default: a temporary directory, printed)
# example: scripts/capi-gpu-check.sh --sucl .dev/capi/sucl --device .dev/capi/device \
#            --bad-input .dev/capi/bad_input --lib .dev/capi/lib --out "$OUT"
set -uo pipefail
usage() { sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; }
SUCL="" DEVICE="" BAD="" LIB="" OUTDIR=""
while [ $# -gt 0 ]; do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --sucl) SUCL="$2"; shift 2 ;;
    --device) DEVICE="$2"; shift 2 ;;
    --bad-input) BAD="$2"; shift 2 ;;
    --lib) LIB="$2"; shift 2 ;;
    --out) OUTDIR="$2"; shift 2 ;;
    *) echo "capi-gpu-check.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
for v in SUCL DEVICE BAD LIB; do
  [ -n "${!v}" ] || { echo "capi-gpu-check.sh: missing --$(echo "$v" | tr 'A-Z' 'a-z' | sed 's/bad/bad-input/')" >&2; exit 2; }
done
for f in "$SUCL" "$DEVICE" "$BAD"; do [ -x "$f" ] || { echo "capi-gpu-check.sh: $f is not an executable" >&2; exit 2; }; done
[ -e "$LIB/libsucl.so.0" ] || { echo "capi-gpu-check.sh: no libsucl.so.0 in $LIB" >&2; exit 2; }
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
export LD_LIBRARY_PATH="$(cd "$LIB" && pwd)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
OUTDIR=${OUTDIR:-$(mktemp -d)}
mkdir -p "$OUTDIR"
echo "capi-gpu-check: logs in $OUTDIR"

"$SUCL" info >"$OUTDIR/info.txt" 2>&1
ngpu=$(grep -c "^  cuda:[0-9]" "$OUTDIR/info.txt")
if [ "$ngpu" -lt 2 ]; then
  echo "capi-gpu-check: FAILED: $ngpu CUDA device(s) found, 2 needed (failing instead of skipping)" >&2
  cat "$OUTDIR/info.txt" >&2
  exit 1
fi
grep -q "^  nccl  available" "$OUTDIR/info.txt" || { echo "capi-gpu-check: FAILED: NCCL unavailable" >&2; exit 1; }
"$DEVICE" --help | grep -q "example:" || { echo "capi-gpu-check: FAILED: device --help gives no example" >&2; exit 1; }

status=0
for count in 1048579 4099; do
  log="$OUTDIR/device-$count.txt"
  echo "== device.c on 2 ranks, $count elements per call"
  timeout 300 "$SUCL" run -n 2 -- "$DEVICE" --count "$count" >"$log" 2>&1
  rc=$?
  cat "$log"
  if [ "$rc" -ne 0 ] || [ "$(grep -c ": 0 wrong" "$log")" -ne 2 ]; then
    echo "capi-gpu-check: FAILED: device.c with $count elements (exit $rc)" >&2
    status=1
  fi
done

echo "== bad_input.c with a GPU present (host pointers refused by the _device calls)"
SUCL_TIMEOUT=5 timeout 120 "$BAD" >"$OUTDIR/bad_input.txt" 2>&1 || { echo "capi-gpu-check: FAILED: bad_input" >&2; status=1; }
cat "$OUTDIR/bad_input.txt"

[ "$status" -eq 0 ] && echo "capi-gpu-check: passed on $ngpu GPUs" || echo "capi-gpu-check: FAILED" >&2
exit "$status"
