#!/usr/bin/env bash
# Halo and Transpose through sucl (sucl/sycl.hpp, shm backend forced) beside their MPI variants
# (Open MPI, btl self,vader), alternating per round at each rank count; prints a markdown table
# of the medians over rounds (ms per step, max over ranks) and sucl/MPI. Every run checks its
# result against the serial reference and the table says if one did not.
# usage: [RANKS="2 4"] [ROUNDS=3] [SIZE=120] [STEPS=50] [BIN=target/bench/sycl] bench/sycl/apps.sh
# (bench/sycl/build.sh first, or it runs it.)
set -euo pipefail
cd "$(dirname "$0")/../.."
case "${1:-}" in -h|--help) sed -n '2,7p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;; esac
RANKS=${RANKS:-2 4}; ROUNDS=${ROUNDS:-3}; SIZE=${SIZE:-120}; STEPS=${STEPS:-50}; BIN=${BIN:-target/bench/sycl}
[ -x "$BIN/halo_mpi" ] || BIN="$BIN" bench/sycl/build.sh
SUCL=${SUCL:-target/release/sucl}
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
for round in $(seq 1 "$ROUNDS"); do
  for r in $RANKS; do
    for app in halo transpose; do
      SUCL_BACKEND=shm timeout 600 "$SUCL" run -n "$r" -- "$BIN/$app" --size "$SIZE" --steps "$STEPS" >>"$out/$app-sucl-$r" 2>&1
      timeout 600 mpirun --allow-run-as-root --oversubscribe --mca btl self,vader -np "$r" "$BIN/${app}_mpi" \
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
print(f"{size}^3 floats, {steps} timed steps, median of {rounds} rounds (ms per step, max over ranks)\n")
print("| app | ranks | sucl ms | MPI ms | sucl/MPI | rounds (sucl; MPI) | checks |")
print("| --- | --- | --- | --- | --- | --- | --- |")
for app in ("halo", "transpose"):
    for r in ranks:
        s, s_ok = runs(f"{app}-sucl-{r}")
        m, m_ok = runs(f"{app}-mpi-{r}")
        if not s or not m:
            print(f"| {app} | {r} | failed | failed | | | see logs |"); continue
        sm, mm = statistics.median(s), statistics.median(m)
        fmt = lambda v: " ".join(f"{x:.2f}" for x in v)
        print(f"| {app} | {r} | {sm:.3f} | {mm:.3f} | {sm / mm:.2f} | {fmt(s)}; {fmt(m)} | {'ok' if s_ok and m_ok else 'WRONG'} |")
PY
