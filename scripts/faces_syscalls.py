#!/usr/bin/env python3
"""Per-step system calls of the Faces host variants, from two `perf trace -s` summaries.

usage: faces_syscalls.py SHORT.txt LONG.txt STEPS_DIFF RANKS
SHORT and LONG ran the same input with two `ni` values; STEPS_DIFF = (nj+1)*(ni_long-ni_short),
the extra shares each variant ran in LONG. Prints, per thread kind (the rank's main thread, which
runs the baseline and issues the triggered variant; the host queue's worker; the progress
engine), the system calls per share summed over both variants' extra shares, averaged over ranks
(the worker and the engine serve only the triggered variant)."""
import re
import sys
from collections import defaultdict

KINDS = {"sucl-host-queue": "worker", "sucl-stream-pro": "engine"}


def parse(path, prog):
    counts = defaultdict(lambda: defaultdict(int))  # kind -> syscall -> calls (summed over ranks)
    ranks = set()
    kind = None
    for line in open(path):
        m = re.match(r"\s*(\S.*?) \((\d+)\), \d+ events", line)
        if m:
            name = m.group(1)
            kind = KINDS.get(name, "main" if prog.startswith(name[:15]) else None)
            if kind == "main":
                ranks.add(m.group(2))
            continue
        m = re.match(r"\s+([a-z_0-9]+)\s+(\d+)\s+\d+\s", line)
        if m and kind:
            counts[kind][m.group(1)] += int(m.group(2))
    return counts, max(len(ranks), 1)


def main():
    short, long_, steps, prog = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
    a, n = parse(short, prog)
    b, _ = parse(long_, prog)
    watch = ["futex", "sched_yield", "clock_nanosleep", "nanosleep"]
    print(f"{'thread':8} " + " ".join(f"{w:>16}" for w in watch) + f" {'all':>8}   (system calls per share per rank)")
    for kind in ["main", "worker", "engine"]:
        row = []
        for w in watch:
            row.append((b[kind][w] - a[kind][w]) / steps / n)
        tot = (sum(b[kind].values()) - sum(a[kind].values())) / steps / n
        print(f"{kind:8} " + " ".join(f"{v:16.2f}" for v in row) + f" {tot:8.2f}")


if __name__ == "__main__":
    main()
