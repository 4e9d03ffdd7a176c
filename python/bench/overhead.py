"""Python's share of a small all_reduce: times `iters` in-place all_reduces of BYTES bytes
(a float64 NumPy array) through the binding; compare with crates/sucl-py/examples/allreduce_loop.

    sucl run -n 2 -- python python/bench/overhead.py [ITERS] [BYTES]
"""

import sys
import time

import numpy as np

import sucl

if "-h" in sys.argv or "--help" in sys.argv:
    print(__doc__)
    sys.exit(0)
iters = int(sys.argv[1]) if len(sys.argv) > 1 else 200_000
nbytes = int(sys.argv[2]) if len(sys.argv) > 2 else 8
comm = sucl.init()
v = np.ones(max(nbytes // 8, 1), np.float64)
ar = comm.all_reduce
for _ in range(iters // 10):
    ar(v)
comm.barrier()
t = time.perf_counter()
for _ in range(iters):
    ar(v)
us = (time.perf_counter() - t) * 1e6 / iters
if comm.rank == 0:
    print(f"python all_reduce {nbytes} B: {us:.3f} us/call")
comm.close()
