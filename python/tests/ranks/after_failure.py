"""After a count-mismatched all_reduce (MismatchError), every later call raises UnusableError: a
broadcast every rank calls alike, an all_reduce whose dtypes differ across ranks, a send. Each
message names the refused call, quotes the first error and says what to do; none reports a
disagreement of its own. Run on 2 or more ranks."""

import numpy as np

import sucl

comm = sucl.init()
r, n = comm.rank, comm.size
assert n >= 2, "needs 2 or more ranks"

try:
    comm.all_reduce(np.ones(4 + r % 2, np.float32))
    raise AssertionError(f"rank {r}: the count-mismatched all_reduce did not raise")
except sucl.MismatchError as e:
    first = str(e)
assert "ranks disagree on" in first, first


def refused(op, f):
    try:
        f()
    except sucl.UnusableError as e:
        msg = str(e)
        assert isinstance(e, sucl.SuclError), type(e)
        assert f"{op} refused: this communicator is unusable" in msg, msg
        assert f'since its all_reduce failed with "{first}"' in msg, (msg, first)
        assert "free it and create a new communicator" in msg, msg
        assert "dtype" not in msg, msg
        return
    raise AssertionError(f"rank {r}: {op} did not raise UnusableError")


refused("broadcast", lambda: comm.broadcast(np.ones(4, np.float32), root=0))
refused("all_reduce", lambda: comm.all_reduce(np.ones(4, np.float32 if r % 2 == 0 else np.float64)))
refused("send", lambda: comm.send(np.ones(1, np.float32), (r + 1) % n))
comm.close()
print(f"OK rank {r}", flush=True)
