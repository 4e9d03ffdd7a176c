#!/usr/bin/env bash
# Hierarchical vs flat tcp collectives on one machine posing as several hosts (SUCL_HOSTNAME per
# rank: HOSTS hosts of PER ranks, in blocks), side by side, alternating per round.
# usage: [HOSTS=2 PER=2 ROUNDS=3 ITERS=100 OP=all_reduce] scripts/bench-hier.sh [SUCL_BINARY]
set -uo pipefail
cd "$(dirname "$0")/.."
S=$(realpath "${1:-target/release/sucl}")
HOSTS=${HOSTS:-2}; PER=${PER:-2}; ROUNDS=${ROUNDS:-3}; ITERS=${ITERS:-100}; OP=${OP:-all_reduce}
MINB=${MINB:-8}; MAXB=${MAXB:-16777216}
N=$((HOSTS * PER)); W=${W:-/tmp/hierbench}
[ -n "${SUMMARY_ONLY:-}" ] || { rm -rf "$W"; mkdir -p "$W"; }
for round in $(seq 1 "$ROUNDS"); do
  [ -n "${SUMMARY_ONLY:-}" ] && break
  for be in tcp hier; do
    echo "round $round/$ROUNDS: $be" >&2
    timeout 600 "$S" run -n "$N" -- sh -c "SUCL_HOSTNAME=host\$((SUCL_RANK / $PER)) exec $S bench $OP --backend $be --min-bytes $MINB --max-bytes $MAXB --iters $ITERS --warmup 10 --json" \
      >$W/$be-$round.jsonl 2>$W/$be-$round.err
  done
done
python3 - "$W" "$ROUNDS" "$HOSTS" "$PER" "$OP" <<'PY'
import json, statistics, sys, os
W, rounds, H, L, op = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
def load(p):
    d = {}
    for l in open(p):
        l = l.split("] ", 1)[1] if l.startswith("[") else l  # the launcher's rank prefix
        if l.startswith("{"):
            o = json.loads(l); d[o["bytes"]] = (o["time_us"], o["busbw_gbps"], o.get("wrong"))
    return d
runs = {be: [load(f"{W}/{be}-{r}.jsonl") for r in range(1, rounds + 1)] for be in ("tcp", "hier")}
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
print(f"# {op}: hierarchical (shm inside, tcp between) vs flat tcp, {H} hosts x {L} ranks on one machine\n")
print(f"Machine: {os.cpu_count()} CPUs ({cpu}); hosts posed by SUCL_HOSTNAME, all traffic on loopback. Median of {rounds} alternating rounds; time = mean over iterations, max over ranks.\n")
print("| bytes | flat tcp µs | hier µs | flat busbw GB/s | hier busbw GB/s | hier/flat busbw | #wrong (both) |")
print("|---:|---:|---:|---:|---:|---:|---:|")
for s in sorted(runs["tcp"][0]):
    if not all(s in x for v in runs.values() for x in v): continue
    t = {be: statistics.median(x[s][0] for x in runs[be]) for be in runs}
    b = {be: statistics.median(x[s][1] for x in runs[be]) for be in runs}
    w = sum((x[s][2] or 0) for v in runs.values() for x in v)
    print(f"| {s} | {t['tcp']:.2f} | {t['hier']:.2f} | {b['tcp']:.3f} | {b['hier']:.3f} | {b['hier']/b['tcp']:.2f} | {w} |")
PY
