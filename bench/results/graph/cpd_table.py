"""Markdown table from cpd_sched.jsonl: scheduler throughput with and without collective
pattern discovery, side by side (bench/results/graph/run.sh)."""
import json, os, sys
d = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(__file__)
rows = [json.loads(l) for l in open(os.path.join(d, "cpd_sched.jsonl")) if l.startswith("{")]
by = {(r["program"], r["ranks"], r["cpd"]): r for r in rows}
print("| program | ranks | tasks/s p2p | tasks/s cpd | speed-up | commands/task p2p | commands/task cpd |")
print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
for (p, n, cpd), r in by.items():
    if cpd:
        continue
    c = by.get((p, n, True))
    if c is None:
        continue
    print(f"| {p} | {n} | {r['tasks_per_s']:.0f} | {c['tasks_per_s']:.0f} | {c['tasks_per_s'] / r['tasks_per_s']:.2f}x "
          f"| {r['commands_per_task']:.2f} | {c['commands_per_task']:.2f} |")
