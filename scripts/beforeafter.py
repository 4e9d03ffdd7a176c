"""Table of scripts/bench-before-after.sh runs: per size, medians of MPI, before and after."""
import json, statistics, sys, os
W, rounds, R, ver = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
def mpi(p):
    d = {}
    for l in open(p):
        f = l.split()
        if len(f) == 5 and f[0].isdigit(): d[int(f[0])] = float(f[2])
    return d
def sucl(p):
    d = {}
    for l in open(p):
        if l.startswith("{"):
            o = json.loads(l); d[o["bytes"]] = (o["time_us"], o.get("wrong"))
    return d
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
print(f"# sucl before/after vs {ver}: all_reduce f32 sum, {R} ranks, {os.cpu_count()} CPUs ({cpu})\n")
print(f"Median of {rounds} rounds (each round: MPI, before, after); time = mean over iterations, max over ranks.\n")
for be in os.environ.get("BACKENDS", "shm tcp").split():
    m = [mpi(f"{W}/mpi-{be}-{r}.txt") for r in range(1, rounds + 1)]
    b = [sucl(f"{W}/before-{be}-{r}.jsonl") for r in range(1, rounds + 1)]
    a = [sucl(f"{W}/after-{be}-{r}.jsonl") for r in range(1, rounds + 1)]
    print(f"## {be} (Open MPI: {'vader' if be == 'shm' else 'btl tcp'})\n")
    print("| bytes | MPI µs | before µs | after µs | after/before | after/MPI | after #wrong |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for s in sorted(m[0]):
        if not all(s in x for x in m + b + a): continue
        mt = statistics.median(x[s] for x in m); bt = statistics.median(x[s][0] for x in b); at = statistics.median(x[s][0] for x in a)
        wr = sum((x[s][1] or 0) for x in a)
        print(f"| {s} | {mt:.2f} | {bt:.2f} | {at:.2f} | {at/bt:.2f} | {at/mt:.2f} | {wr} |")
    print()
