#!/usr/bin/env python3
"""Writes the rows of a figure's CSV as `sucl bench --json` rows, for `sucl plot` to draw.

usage: plot.py host-shm-vs-mpi [RANKS,..]  |  plot.py gpu-ipc-vs-nccl   (CSV read from bench/data/)
busbw uses nccl-tests' all_reduce factor 2(n-1)/n; f32 sum throughout.
"""
import csv, json, os, sys

here = os.path.dirname(os.path.abspath(__file__))


def row(backend, ranks, nbytes, us):
    algbw = nbytes / (us * 1e-6) / 1e9
    return {"op": "all_reduce", "backend": backend, "ranks": ranks, "bytes": nbytes, "count": nbytes // 4,
            "dtype": "f32", "redop": "sum", "time_us": us, "algbw_gbps": algbw,
            "busbw_gbps": algbw * 2 * (ranks - 1) / ranks, "wrong": 0}


def main():
    fig = sys.argv[1]
    rows = list(csv.DictReader(open(os.path.join(here, "data", fig + ".csv"))))
    out = []
    if fig == "host-shm-vs-mpi":
        keep = sys.argv[2].split(",") if len(sys.argv) > 2 else ["2", "16"]
        for name, col in (("sucl shm", "sucl_us"), ("Open MPI vader", "mpi_us")):
            for r in rows:
                if r["ranks"] in keep:
                    out.append(row(name, int(r["ranks"]), int(r["bytes"]), float(r[col])))
    elif fig == "gpu-ipc-vs-nccl":
        for name, col in (("sucl ipc", "ipc_us"), ("sucl nccl", "sucl_nccl_us"), ("NCCL called directly", "raw_nccl_us")):
            out += [row(name, 2, int(r["bytes"]), float(r[col])) for r in rows if r["mode"] == "stream"]
    else:
        sys.exit(f"plot.py: no plot for `{fig}`")
    for o in out:
        print(json.dumps(o))


if __name__ == "__main__":
    main()
