#!/usr/bin/env python3
"""Alternating side-by-side runs of `sucl bench` (bench/results/vcoll/README.md).

    compare.py --variant before=PATH --variant after=PATH[:ENV=VAL...] [--ops ...] [--sizes ...]
               [--ranks N] [--reps R] [--iters I] [--backend shm|tcp]

Every (op, size) runs once per variant per round, the variants' order reversed every other
round; prints the median time (us, `sucl bench`'s: mean over timed iterations, max over ranks)
per variant, and for a v-op whose plain op is also listed, the ratio v / plain per variant.
Timed iterations: 20 x ITERS up to 64 KiB, ITERS below 8 MiB, ITERS / 4 (at least 3) above.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

ap = argparse.ArgumentParser()
ap.add_argument("--variant", action="append", required=True)
ap.add_argument("--ops", default="all_gatherv,all_to_allv")
ap.add_argument("--sizes", default="8,64K,1M,16M,64M")
ap.add_argument("--ranks", type=int, default=2)
ap.add_argument("--reps", type=int, default=5)
ap.add_argument("--iters", type=int, default=20)
ap.add_argument("--backend", default="shm")
a = ap.parse_args()
def parse_size(s):
    m = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(s[:-1]) * m[s[-1]] if s[-1] in m else int(s)
variants = []
for v in a.variant:
    name, rest = v.split("=", 1)
    parts = rest.split(":")
    env = dict(os.environ)
    for kv in parts[1:]:
        k, val = kv.split("=", 1); env[k] = val
    variants.append((name, parts[0], env))
res = {}
for rep in range(a.reps):
    for op in a.ops.split(","):
        for size in a.sizes.split(","):
            b = parse_size(size)
            iters = a.iters if b < (8 << 20) else max(3, a.iters // 4)
            if b <= 65536: iters = a.iters * 20
            order = variants if rep % 2 == 0 else variants[::-1]
            for name, binary, env in order:
                cmd = [binary, "bench", op, "--ranks", str(a.ranks), "--backend", a.backend, "--min-bytes", str(b), "--max-bytes", str(b),
                       "--iters", str(iters), "--warmup", "3", "--json"]
                out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
                rows = [json.loads(l) for l in out.stdout.splitlines() if l.startswith("{")]
                if not rows:
                    print("FAILED", name, op, size, out.stderr[-500:], file=sys.stderr); continue
                r = rows[0]
                if r.get("wrong"):
                    print("WRONG", name, op, size, r, file=sys.stderr)
                res.setdefault((name, op, b), []).append(r["time_us"])
print(f"ranks {a.ranks} backend {a.backend}, median of {a.reps} alternating runs, time in us")
names = [v[0] for v in variants]
ops = a.ops.split(",")
med = lambda n, op, b: statistics.median(res[(n, op, b)]) if res.get((n, op, b)) else None
ratio_names = [f"v/plain {n}" for n in names]
print("| op | bytes | " + " | ".join(names) + " | " + " | ".join(ratio_names) + " |")
print("| --- | ---: | " + " | ".join("---:" for _ in names + ratio_names) + " |")
for op in ops:
    for size in a.sizes.split(","):
        b = parse_size(size)
        cells = [f"{med(n, op, b):.2f}" if med(n, op, b) is not None else "-" for n in names]
        plain = op[:-1] if op.endswith("v") else None
        for n in names:
            v, p = med(n, op, b), (med(n, plain, b) if plain in ops else None)
            cells.append(f"{v / p:.2f}" if v and p else "")
        print(f"| {op} | {size} | " + " | ".join(cells) + " |")
