#!/usr/bin/env python3
"""Summarizes before_after.sh rounds: per row, the median over rounds of each round's median
(with the range), p99 and mean, before and after, and after / before of the medians."""
import re, sys, glob, statistics
def rows(path):
    out = {}
    for line in open(path):
        m = re.match(r"\| (.+?) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \|\s*$", line)
        if m:
            out[m.group(1)] = tuple(float(x) for x in m.groups()[1:])
    return out
runs = sys.argv[1] if len(sys.argv) > 1 else "runs"
b = [rows(p) for p in sorted(glob.glob(f"{runs}/before-*.md"))]
a = [rows(p) for p in sorted(glob.glob(f"{runs}/after-*.md"))]
names = [k for k in b[0] if k in a[0]] + [k for k in a[0] if k not in b[0]]
print("| what | before: median µs (median of rounds; range) | before: p99 µs | before: mean µs | after: median µs (median of rounds; range) | after: p99 µs | after: mean µs | after / before (medians) |")
print("|---|---:|---:|---:|---:|---:|---:|---:|")
def cell(rs, k):
    if k not in rs[0]:
        return ("—", "—", "—", None)
    med = [r[k][0] for r in rs]; p99 = [r[k][1] for r in rs]; mean = [r[k][2] for r in rs]
    m = statistics.median(med)
    return (f"{m:.0f} ({min(med):.0f}–{max(med):.0f})", f"{statistics.median(p99):.0f}", f"{statistics.median(mean):.0f}", m)
for k in names:
    cb, ca = cell(b, k), cell(a, k)
    ratio = f"{ca[3]/cb[3]:.2f}" if cb[3] and ca[3] else "—"
    print(f"| {k} | {cb[0]} | {cb[1]} | {cb[2]} | {ca[0]} | {ca[1]} | {ca[2]} | {ratio} |")
