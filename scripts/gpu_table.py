#!/usr/bin/env python3
"""Markdown tables from gpu-check.sh's bench.jsonl: per op and size, the time of raw NCCL, sucl
over NCCL, staged and auto (best of interleaved rounds in one job), sucl's overhead over raw NCCL,
busbw, and auto's ratio to the better of nccl and staged."""
import json, sys

path, title = sys.argv[1], sys.argv[2]
rows = [json.loads(l) for l in open(path) if l.startswith("{")]
print(f"# {title}\n")
for op, ranks in dict.fromkeys((r["op"], r["ranks"]) for r in rows):
    by = {}
    for r in rows:
        if r["op"] == op and r["ranks"] == ranks:
            by.setdefault(r["bytes"], {})[r["backend"]] = r
    print(f"## {op}, {ranks} GPUs\n")
    print("| bytes | raw NCCL (µs) | sucl nccl (µs) | overhead (µs) | staged (µs) | auto (µs) | raw busbw | nccl busbw | nccl/raw busbw | staged busbw | auto / best |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for b in sorted(by):
        d = by[b]
        t = {k: d[k]["time_us"] for k in d}
        bw = {k: d[k]["busbw_gbps"] for k in d}
        best = min(t["nccl"], t["staged"])
        print(f"| {b} | {t['raw']:.2f} | {t['nccl']:.2f} | {t['nccl'] - t['raw']:+.2f} | {t['staged']:.2f} | {t['auto']:.2f} | "
              f"{bw['raw']:.1f} | {bw['nccl']:.1f} | {bw['nccl'] / bw['raw'] if bw['raw'] else float('nan'):.3f} | {bw['staged']:.2f} | {t['auto'] / best:.3f} |")
    print()
