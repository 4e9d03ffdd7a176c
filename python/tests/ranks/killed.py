"""The last rank dies (SIGKILL) in the middle of a run of all_reduces; every survivor must get
a sucl error (lost peer or aborted), never hang."""

import os
import signal
import sys

import numpy as np

import sucl

signal.signal(signal.SIGTERM, signal.SIG_IGN)  # see test_a_killed_rank_raises_on_every_survivor
comm = sucl.init()
r, n = comm.rank, comm.size
x = np.ones(1024, np.float32)
for step in range(1000):
    if r == n - 1 and step == 20:
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        comm.all_reduce(x, op="max")
    except sucl.SuclError as e:
        kind = type(e).__name__
        assert isinstance(e, (sucl.LostPeerError, sucl.AbortedError)), f"unexpected {kind}: {e}"
        print(f"RAISED rank {r} step {step} {kind}: {e}", flush=True)
        sys.exit(0)
print(f"NOT RAISED rank {r}", flush=True)
sys.exit(1)
