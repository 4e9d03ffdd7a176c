#!/usr/bin/env python3
"""Writes select-bench.sh's results as markdown: the tuning run's per-size winners, then the
side-by-side comparison of the fixed backends and `auto` (target: auto within 5% of the best
fixed backend, or within 1 µs where that is under 20 µs)."""
import json, sys

raw, ranks, ops, table = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(), sys.argv[4]
print(f"# Backend selection: {ranks} ranks on one host\n")
print(f"Command: `scripts/select-bench.sh {ranks}`. Step 1, `sucl tune` under mpirun, measured every backend "
      f"(best of 3 interleaved rounds) and wrote `{table}`:\n")
print("```")
print(open(f"{raw}/tune.txt").read().strip())
print("```\n")
print("Step 2, `sucl bench OP --compare shm,tcp,mpi,auto --config TABLE`: every choice measured side by side in one job, "
      "best of 3 interleaved rounds per size; `auto` follows the table.\n")
for op in ops:
    rows = {}
    for line in open(f"{raw}/{op}.txt"):
        if line.startswith("{"):
            o = json.loads(line)
            rows.setdefault(o["bytes"], {})[o["backend"]] = o["time_us"]
    print(f"## {op}\n")
    print("| bytes | shm (µs) | tcp (µs) | mpi (µs) | best fixed | auto (µs) | auto / best | within target |")
    print("|---:|---:|---:|---:|:--|---:|---:|:--|")
    worst, misses = 0.0, 0
    for b in sorted(rows):
        r = rows[b]
        best_b = min(("shm", "tcp", "mpi"), key=lambda k: r[k])
        best = r[best_b]
        ratio = r["auto"] / best
        ok = ratio <= 1.05 or (best < 20 and r["auto"] - best <= 1.0)
        misses += not ok
        worst = max(worst, ratio)
        print(f"| {b} | {r['shm']:.2f} | {r['tcp']:.2f} | {r['mpi']:.2f} | {best_b} | {r['auto']:.2f} | {ratio:.3f} | {'yes' if ok else 'NO'} |")
    print(f"\nWorst auto/best: {worst:.3f}; sizes outside the target: {misses}.\n")
