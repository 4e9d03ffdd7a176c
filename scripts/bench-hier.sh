#!/usr/bin/env bash
# Hierarchical vs flat tcp collectives on one machine posing as several hosts (SUCL_HOSTNAME per
# rank: HOSTS hosts of PER ranks, in blocks), side by side, alternating per round.
#
# usage: [HOSTS=2 PER=2 ROUNDS=3 ITERS=100 OP=all_reduce PROFILE=1] scripts/bench-hier.sh [BEFORE] [AFTER]
#   one binary (default target/release/sucl): flat tcp vs hier with it;
#   two binaries: each round runs tcp and hier with BEFORE, then with AFTER, and the table puts
#   them side by side (times, hier/flat busbw of each, after/before time ratios, and every
#   round's flat tcp time at small sizes, where runs used to be bimodal).
#   PROFILE=1: one more hier run per binary at 16 MiB with the per-phase profile (RUST_LOG debug).
set -uo pipefail
cd "$(dirname "$0")/.."
BINS=()
for b in "${@:-target/release/sucl}"; do BINS+=("$(realpath "$b")"); done
[ ${#BINS[@]} -le 2 ] || { echo "usage: $0 [BEFORE] [AFTER]" >&2; exit 2; }
HOSTS=${HOSTS:-2}; PER=${PER:-2}; ROUNDS=${ROUNDS:-3}; ITERS=${ITERS:-100}; OP=${OP:-all_reduce}
MINB=${MINB:-8}; MAXB=${MAXB:-16777216}
N=$((HOSTS * PER)); W=${W:-/tmp/hierbench}
LABELS=(after); [ ${#BINS[@]} -eq 2 ] && LABELS=(before after)
[ -n "${SUMMARY_ONLY:-}" ] || { rm -rf "$W"; mkdir -p "$W"; }
run() { # binary backend min max iters out err [env...]
  local s=$1 be=$2 lo=$3 hi=$4 it=$5 out=$6 err=$7; shift 7
  env "$@" timeout 600 "$s" run -n "$N" -- sh -c "SUCL_HOSTNAME=host\$((SUCL_RANK / $PER)) exec $s bench $OP --backend $be --min-bytes $lo --max-bytes $hi --iters $it --warmup 10 --json" >"$out" 2>"$err"
}
for round in $(seq 1 "$ROUNDS"); do
  [ -n "${SUMMARY_ONLY:-}" ] && break
  for be in tcp hier; do
    for i in "${!BINS[@]}"; do
      echo "round $round/$ROUNDS: $be (${LABELS[$i]}: ${BINS[$i]})" >&2
      run "${BINS[$i]}" "$be" "$MINB" "$MAXB" "$ITERS" "$W/${LABELS[$i]}-$be-$round.jsonl" "$W/${LABELS[$i]}-$be-$round.err"
    done
  done
done
if [ -n "${PROFILE:-}" ] && [ -z "${SUMMARY_ONLY:-}" ]; then
  for i in "${!BINS[@]}"; do
    run "${BINS[$i]}" hier 16M 16M 20 /dev/null "$W/${LABELS[$i]}-profile.err" RUST_LOG=sucl_runtime::hier=debug
  done
fi
python3 - "$W" "$ROUNDS" "$HOSTS" "$PER" "$OP" "${LABELS[@]}" <<'PY'
import json, statistics, sys, os, re
W, rounds, H, L, op, labels = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5], sys.argv[6:]
def load(p):
    d = {}
    for l in open(p):
        l = l.split("] ", 1)[1] if l.startswith("[") else l  # the launcher's rank prefix
        if l.startswith("{"):
            o = json.loads(l); d[o["bytes"]] = (o["time_us"], o["busbw_gbps"], o.get("wrong"))
    return d
runs = {(lb, be): [load(f"{W}/{lb}-{be}-{r}.jsonl") for r in range(1, rounds + 1)] for lb in labels for be in ("tcp", "hier")}
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
print(f"# {op}: hierarchical (shm inside, tcp between) vs flat tcp, {H} hosts x {L} ranks on one machine\n")
print(f"Machine: {os.cpu_count()} CPUs ({cpu}); hosts posed by SUCL_HOSTNAME, all traffic on loopback. Median of {rounds} alternating rounds; time = mean over iterations, max over ranks. Binaries: {', '.join(labels)}.\n")
med = lambda k, s, i: statistics.median(x[s][i] for x in runs[k])
cols = [f"{lb} {be} µs" for be in ("tcp", "hier") for lb in labels] + [f"{lb} hier/flat busbw" for lb in labels]
if len(labels) == 2:
    cols += ["tcp after/before time", "hier after/before time"]
cols += [f"{lb} tcp µs, every round" for lb in labels] + ["#wrong (all)"]
print("| bytes | " + " | ".join(cols) + " |")
print("|---:" * (len(cols) + 1) + "|")
for s in sorted(runs[(labels[0], "tcp")][0]):
    if not all(s in x for v in runs.values() for x in v): continue
    row = [f"{med((lb, be), s, 0):.2f}" for be in ("tcp", "hier") for lb in labels]
    row += [f"{med((lb, 'hier'), s, 1) / med((lb, 'tcp'), s, 1):.2f}" for lb in labels]
    if len(labels) == 2:
        row += [f"{med(('after', be), s, 0) / med(('before', be), s, 0):.2f}" for be in ("tcp", "hier")]
    row += [" / ".join(f"{x[s][0]:.0f}" for x in runs[(lb, "tcp")]) for lb in labels]
    row.append(str(sum((x[s][2] or 0) for v in runs.values() for x in v)))
    print(f"| {s} | " + " | ".join(row) + " |")
for lb in labels:
    p = f"{W}/{lb}-profile.err"
    if os.path.exists(p):
        print(f"\nProfile, {lb}, 16 MiB hier (per rank, all calls incl. warm-up):\n")
        for l in open(p):
            if "profile" in l:
                print("    " + re.sub(r"\x1b\[[0-9;]*m", "", l.split("sucl_runtime::hier:", 1)[-1]).strip())
PY
