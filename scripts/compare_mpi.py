#!/usr/bin/env python3
"""Merges the raw runs of bench-vs-mpi.sh into a markdown table of per-size medians and ratios."""
import json, os, platform, statistics, sys

raw, ranks, ops, rounds, mpiver = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(), int(sys.argv[4]), sys.argv[5]

def mpi_rows(path):
    rows = {}
    for line in open(path):
        f = line.split()
        if len(f) == 5 and f[0].isdigit():
            rows[int(f[0])] = (float(f[2]), float(f[4]))
    return rows

def sucl_rows(path):
    rows = {}
    for line in open(path):
        if line.startswith("{"):
            o = json.loads(line)
            rows[o["bytes"]] = (o["time_us"], o["busbw_gbps"], o["wrong"])
    return rows

cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), platform.processor())
print(f"# sucl vs {mpiver}: {ranks} ranks on one host\n")
print(f"Machine: {os.cpu_count()} CPUs ({cpu}). Each cell is the median of {rounds} alternating runs "
      f"(MPI, sucl, MPI, sucl, ...); time = mean over iterations, max over ranks. "
      f"Ratio = sucl time / MPI time (below 1 is faster) and sucl busbw / MPI busbw (above 1 is faster).\n")
print("Command: `scripts/bench-vs-mpi.sh " + " ".join(sys.argv[2:3]) + f" {rounds} \"{' '.join(ops)}\"`\n")
for op in ops:
    for be, mpibtl in (("shm", "vader"), ("tcp", "tcp")):
        m = [mpi_rows(f"{raw}/mpi-{be}-{op}-{r}.txt") for r in range(1, rounds + 1)]
        s = [sucl_rows(f"{raw}/sucl-{be}-{op}-{r}.jsonl") for r in range(1, rounds + 1)]
        print(f"## {op}, sucl `{be}` vs Open MPI `btl {mpibtl}`\n")
        print("| bytes | MPI time (µs) | sucl time (µs) | time ratio | MPI busbw (GB/s) | sucl busbw (GB/s) | busbw ratio | #wrong |")
        print("|---:|---:|---:|---:|---:|---:|---:|---:|")
        for b in sorted(m[0]):
            if not all(b in x for x in m + s):
                continue
            mt = statistics.median(x[b][0] for x in m); mb = statistics.median(x[b][1] for x in m)
            st = statistics.median(x[b][0] for x in s); sb = statistics.median(x[b][1] for x in s)
            wrong = sum(x[b][2] for x in s)
            print(f"| {b} | {mt:.2f} | {st:.2f} | {st/mt:.2f} | {mb:.3f} | {sb:.3f} | {sb/mb if mb else float('nan'):.2f} | {wrong} |")
        print()
