"""Table of scripts/bench-variants.sh runs: per size, medians over rounds of MPI, before and each variant."""
import json, os, statistics, sys

W, rounds, R, backend, ver, variants = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5], sys.argv[6].split()
names = [v.split(":", 1)[0] for v in variants]


def mpi(path):
    out = {}
    for line in open(path):
        f = line.split()
        if len(f) == 5 and f[0].isdigit():
            out[int(f[0])] = float(f[2])
    return out


def sucl(path):
    out = {}
    for line in open(path):
        if line.startswith("{"):
            o = json.loads(line)
            out[o["bytes"]] = (o["time_us"], o.get("wrong"))
    return out


runs = {"MPI": [mpi(f"{W}/mpi-{r}.txt") for r in range(1, rounds + 1)]}
for n in ["before"] + names:
    runs[n] = [sucl(f"{W}/{n}-{r}.jsonl") for r in range(1, rounds + 1)]
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
print(f"# sucl {backend} settings side by side vs {ver}: all_reduce f32 sum, {R} ranks, {os.cpu_count()} CPUs ({cpu})\n")
print(f"Median of {rounds} rounds (each round: MPI, then before and every variant, in reverse order every other round); time (µs) = mean over iterations, max over ranks.")
print("Variants: " + "; ".join(f"`{v}`" for v in variants) + "\n")
cols = ["MPI", "before"] + names
print("| bytes | " + " | ".join(cols) + " | " + " | ".join(f"{n}/MPI" for n in names) + " | " + " | ".join(f"{n}/before" for n in names) + " | #wrong |")
print("|---:|" + "---:|" * (len(cols) + 2 * len(names) + 1))
for s in sorted(runs["MPI"][0]):
    if not all(s in x for rs in runs.values() for x in rs):
        continue
    med = {}
    for c in cols:
        med[c] = statistics.median((x[s] if c == "MPI" else x[s][0]) for x in runs[c])
    wrong = sum((x[s][1] or 0) for n in names for x in runs[n])
    cells = [f"{med[c]:.2f}" for c in cols] + [f"{med[n] / med['MPI']:.2f}" for n in names] + [f"{med[n] / med['before']:.2f}" for n in names]
    print(f"| {s} | " + " | ".join(cells) + f" | {wrong} |")
