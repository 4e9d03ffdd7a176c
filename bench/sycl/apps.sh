#!/usr/bin/env bash
# Halo and Transpose through sucl (sucl/sycl.hpp, shm backend forced; waiting for each step, and
# with --ahead: every step submitted at once) beside their MPI variants
# (Open MPI, btl self,vader, no binding, as sucl run), alternating per round at each rank count,
# one OpenMP thread per rank for the kernels (OMP_NUM_THREADS, default 1); prints a markdown table
# of the medians over rounds (ms per step, max over ranks) and sucl/MPI. Every run checks its
# result against the serial reference and the table says if one did not.
# usage: [RANKS="2 4"] [ROUNDS=3] [SIZE=120] [STEPS=50] [OMP_NUM_THREADS=1] [BIN=target/bench/sycl]
#        bench/sycl/apps.sh            (bench/sycl/build.sh first, or it runs it)
set -euo pipefail
case "${1:-}" in -h|--help) sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;; esac
cd "$(dirname "$0")/../.."
RANKS=${RANKS:-2 4}; ROUNDS=${ROUNDS:-3}; SIZE=${SIZE:-120}; STEPS=${STEPS:-50}; BIN=${BIN:-target/bench/sycl}
[ -x "$BIN/halo_mpi" ] || BIN="$BIN" bench/sycl/build.sh
SUCL=${SUCL:-target/release/sucl}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
for round in $(seq 1 "$ROUNDS"); do
  for r in $RANKS; do
    for app in halo transpose; do
      SUCL_BACKEND=shm timeout 600 "$SUCL" run -n "$r" -- "$BIN/$app" --size "$SIZE" --steps "$STEPS" >>"$out/$app-sucl-$r" 2>&1
      SUCL_BACKEND=shm timeout 600 "$SUCL" run -n "$r" -- "$BIN/$app" --size "$SIZE" --steps "$STEPS" --ahead \
        >>"$out/$app-ahead-$r" 2>&1
      timeout 600 mpirun --allow-run-as-root --oversubscribe --bind-to none --mca btl self,vader -x OMP_NUM_THREADS -np "$r" "$BIN/${app}_mpi" \
        --size "$SIZE" --steps "$STEPS" >>"$out/$app-mpi-$r" 2>&1
    done
  done
done
python3 - "$out" "$RANKS" "$SIZE" "$STEPS" "$ROUNDS" <<'PY'
import re, statistics, sys
out, ranks, size, steps, rounds = sys.argv[1], sys.argv[2].split(), *sys.argv[3:]
def runs(name):
    text = open(f"{out}/{name}").read()
    ms = [float(x) for x in re.findall(r"([0-9.]+) ms/", text)]
    checks = re.findall(r"check (\w+)", text)
    return ms, all(c == "ok" for c in checks) and len(checks) == len(ms) and ms
print(f"{size}^3 floats, {steps} timed steps, median of {rounds} rounds (ms per step, max over ranks), OMP_NUM_THREADS={__import__('os').environ['OMP_NUM_THREADS']}\n")
print("| app | ranks | sucl ms | MPI ms | sucl/MPI | sucl --ahead ms | ahead/MPI | rounds (sucl; ahead; MPI) | checks |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
for app in ("halo", "transpose"):
    for r in ranks:
        s, s_ok = runs(f"{app}-sucl-{r}")
        a, a_ok = runs(f"{app}-ahead-{r}")
        m, m_ok = runs(f"{app}-mpi-{r}")
        if not s or not a or not m:
            print(f"| {app} | {r} | failed | | | | | | see logs |"); continue
        sm, am, mm = statistics.median(s), statistics.median(a), statistics.median(m)
        fmt = lambda v: " ".join(f"{x:.2f}" for x in v)
        ok = "ok" if s_ok and a_ok and m_ok else "WRONG"
        print(f"| {app} | {r} | {sm:.3f} | {mm:.3f} | {sm / mm:.2f} | {am:.3f} | {am / mm:.2f} | {fmt(s)}; {fmt(a)}; {fmt(m)} | {ok} |")
PY
