"""Markdown tables of the collective pattern discovery benchmarks (graph-scheduler.sh): scheduler
throughput (cpd_sched.jsonl), communication-only throughput (cpd_comm.jsonl) and N-body strong
scaling (cpd_nbody.jsonl), each with and without discovery. Every cell is a median over rounds;
a speed-up is the median of the per-round ratios (both modes of a round ran back to back), with
their min-max beside it.

python3 bench/cpd_tables.py [DIR]"""
import json, os, statistics, sys
from collections import defaultdict

d = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))


def load(name):
    path = os.path.join(d, name)
    if not os.path.exists(path):
        return []
    return [json.loads(l) for l in open(path) if l.startswith("{")]


def paired(rows, key, field):
    """{key: [(off, on), ...] per round} for rows with both modes."""
    rounds = defaultdict(dict)
    order = []
    for r in rows:
        k = key(r)
        if k not in order:
            order.append(k)
        rounds[k + (r.get("round", 0),)][r["cpd"]] = r[field]
    out = {}
    for k in order:
        pairs = [(v[False], v[True]) for kk, v in rounds.items() if kk[: len(k)] == k and len(kk) == len(k) + 1 and True in v and False in v]
        if pairs:
            out[k] = pairs
    return out


def summary(pairs):
    off = statistics.median(p[0] for p in pairs)
    on = statistics.median(p[1] for p in pairs)
    ratios = [p[1] / p[0] for p in pairs if p[0] > 0]
    return off, on, statistics.median(ratios), min(ratios), max(ratios)


def size(b):
    return f"{b >> 20} MiB" if b >= 1 << 20 else f"{b >> 10} KiB"


sched = load("cpd_sched.jsonl")
if sched:
    print("## Scheduler throughput (graph only, rank 0 of N simulated ranks), tasks per CPU-second\n")
    print("| program | ranks | rounds | p2p tasks/s | cpd tasks/s | speed-up | min-max |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for (p, n), pairs in paired(sched, lambda r: (r["program"], r["ranks"]), "tasks_per_s").items():
        off, on, med, lo, hi = summary(pairs)
        print(f"| {p} | {n} | {len(pairs)} | {off:.0f} | {on:.0f} | {med:.2f}x | {lo:.2f}-{hi:.2f} |")
    print()

comm = [r for r in load("cpd_comm.jsonl") if r.get("bench") == "comm"]
if comm:
    print("## Communication-only throughput (kernels off), iterations per second\n")
    print("| program | ranks | buffer | rounds | p2p it/s | cpd it/s | speed-up | min-max |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for (p, n, b), pairs in paired(comm, lambda r: (r["program"], r["ranks"], r["bytes"]), "iterations_per_s").items():
        off, on, med, lo, hi = summary(pairs)
        print(f"| {p} | {n} | {size(b)} | {len(pairs)} | {off:.1f} | {on:.1f} | {med:.2f}x | {lo:.2f}-{hi:.2f} |")
    print()

nb = load("cpd_nbody.jsonl")
steps = [r for r in nb if r.get("bench") == "nbody"]
if steps:
    wrong = defaultdict(int)
    for r in nb:
        if r.get("bench") == "nbody_check":
            wrong[(r["ranks"], r["bodies"])] += r["wrong"]
    print("## N-body (f64, direct) strong scaling, steps per second\n")
    print("| bodies | ranks | rounds | p2p steps/s | cpd steps/s | speed-up | min-max | p2p scaling | cpd scaling | #wrong |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    table = paired(steps, lambda r: (r["bodies"], r["ranks"]), "steps_per_s")
    base = {}
    for (b, n), pairs in table.items():
        off, on, med, lo, hi = summary(pairs)
        base.setdefault(b, (off, on))
        b_off, b_on = base[b]
        print(f"| {b} | {n} | {len(pairs)} | {off:.3f} | {on:.3f} | {med:.2f}x | {lo:.2f}-{hi:.2f} "
              f"| {off / b_off:.2f} | {on / b_on:.2f} | {wrong[(n, b)]} |")
