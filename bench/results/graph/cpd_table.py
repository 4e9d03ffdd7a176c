"""Markdown table from cpd_sched.jsonl: scheduler throughput with and without collective
pattern discovery, side by side (graph_sched_bench --json [--rounds R]). With several rounds
per (program, ranks), each cell is the median over rounds, the speed-up is the median of the
per-round ratios (both modes of a round ran back to back), and min-max of those ratios is
shown."""
import json, os, statistics, sys
from collections import defaultdict

d = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(__file__)
name = sys.argv[2] if len(sys.argv) > 2 else "cpd_sched.jsonl"
rows = [json.loads(l) for l in open(os.path.join(d, name)) if l.startswith("{")]
runs = defaultdict(dict)  # (program, ranks, round) -> {cpd: row}
order = []
for r in rows:
    key = (r["program"], r["ranks"])
    if key not in order:
        order.append(key)
    runs[key + (r.get("round", 0),)][r["cpd"]] = r
print("| program | ranks | rounds | tasks/s p2p | tasks/s cpd | speed-up (median) | speed-up min-max | commands/task p2p | commands/task cpd |")
print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
for p, n in order:
    pairs = [v for k, v in runs.items() if k[:2] == (p, n) and True in v and False in v]
    if not pairs:
        continue
    off = statistics.median(v[False]["tasks_per_s"] for v in pairs)
    on = statistics.median(v[True]["tasks_per_s"] for v in pairs)
    ratios = [v[True]["tasks_per_s"] / v[False]["tasks_per_s"] for v in pairs]
    print(f"| {p} | {n} | {len(pairs)} | {off:.0f} | {on:.0f} | {statistics.median(ratios):.2f}x "
          f"| {min(ratios):.2f}-{max(ratios):.2f} | {pairs[0][False]['commands_per_task']:.2f} "
          f"| {pairs[0][True]['commands_per_task']:.2f} |")
