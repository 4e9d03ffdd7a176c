#!/usr/bin/env python3
"""Turns the JSON lines of bench-mpi-backend.sh into a markdown table: per op and size, the best
time of each choice, the mpi backend's ratio and difference to MPI called directly, and whether
the target (<= 1.1x the time, or <= +0.2 us) holds."""
import json, os, platform, sys

raw, ranks, rounds, iters, ops, mpiver = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5].split(), sys.argv[6]
minb, maxb = (sys.argv[7], sys.argv[8]) if len(sys.argv) > 8 else ("8", "16M")
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), platform.processor())
print(f"# sucl's mpi backend vs {mpiver} called directly: {ranks} ranks on one host\n")
print(f"Machine: this development machine, {os.cpu_count()} CPU cores ({cpu}), shared with other work "
      f"(load averages below). No GPU.\n")
print(f"Command: `ITERS={iters} MINB={minb} MAXB={maxb} scripts/bench-mpi-backend.sh {rounds} \"{' '.join(ops)}\"`, i.e. per op "
      f"`mpirun -n {ranks} --bind-to core sucl bench OP --compare mpi,raw-mpi,mpi-nonblocking --min-bytes {minb} "
      f"--max-bytes {maxb} --factor 2 --iters {iters} --warmup 5 --rounds {rounds} --json`: the three choices side by "
      f"side in one job, interleaved, best of {rounds} rounds per size; time = mean over the timed iterations, max "
      f"over ranks; f32, sum. Every measurement of every choice is checked against the serial reference (#wrong).\n")
print("- `raw-mpi`: MPI_Allreduce / MPI_Bcast / MPI_Allgather on MPI_COMM_WORLD, nothing of sucl around it.")
print("- `mpi`: the backend now — MPI's blocking collectives on the caller's thread, bounded by the watchdog.")
print("- `mpi-nonblocking`: the backend on MPI's non-blocking collectives polled with MPI_Test, the path it "
      "took before this change (kept behind `sucl_mpi::set_nonblocking_collectives`).\n")
print("Target: mpi ≤ 1.1× raw-mpi's time, or ≤ raw + 0.2 µs.\n")
for op in ops:
    rows = {}
    for line in open(os.path.join(raw, f"{op}.jsonl")):
        if line.startswith("{"):
            o = json.loads(line)
            rows.setdefault(o["bytes"], {})[o["backend"]] = o
    load = open(os.path.join(raw, f"{op}.load")).read().split("\n")
    loads = [l.split("load average:")[1].strip() for l in load if "load average:" in l]
    print(f"## {op}\n\nLoad average before / after: {' / '.join(loads)}\n")
    print("| bytes | raw-mpi (µs) | mpi (µs) | mpi-nonblocking (µs) | mpi / raw | mpi − raw (µs) | target | nonblocking / raw | #wrong |")
    print("|---:|---:|---:|---:|---:|---:|:---:|---:|---:|")
    met = 0
    for b in sorted(rows):
        r = rows[b]
        raw_t, m, nb = r["raw-mpi"]["time_us"], r["mpi"]["time_us"], r["mpi-nonblocking"]["time_us"]
        wrong = sum((r[c]["wrong"] or 0) for c in r)
        ok = m <= 1.1 * raw_t or m - raw_t <= 0.2
        met += ok
        print(f"| {b} | {raw_t:.2f} | {m:.2f} | {nb:.2f} | {m / raw_t:.3f} | {m - raw_t:+.2f} | {'yes' if ok else 'NO'} | {nb / raw_t:.3f} | {wrong} |")
    print(f"\nTarget met at {met} of {len(rows)} sizes.\n")
