"""Bad arguments raise InvalidArgumentError on the calling rank before any data moves: the
output buffers stay untouched and the next (good) collective still works on every rank."""

import numpy as np

import sucl

comm = sucl.init()
r, n = comm.rank, comm.size


def raises(what, f, exc=sucl.InvalidArgumentError):
    try:
        f()
    except exc as e:
        assert isinstance(e, sucl.SuclError) and str(e), (what, e)
        return str(e)
    raise AssertionError(f"rank {r}: {what}: no {exc.__name__}")


send = np.arange(8, dtype=np.float32) + r
out = np.full(8, -1.0, np.float32)
# recv shorter than send
raises("short recv", lambda: comm.all_reduce(send, out[:4]))
# element types differ
raises("dtype pair", lambda: comm.all_reduce(send, np.zeros(8, np.float64)))
# read-only output
ro = np.zeros(8, np.float32)
ro.flags.writeable = False
raises("read-only recv", lambda: comm.all_reduce(send, ro))
raises("read-only in place", lambda: comm.all_reduce(ro))
# overlapping send and recv
both = np.zeros(12, np.float32)
raises("overlap", lambda: comm.all_reduce(both[:8], both[4:]))
# non-contiguous
raises("strided", lambda: comm.all_reduce(np.zeros(16, np.float32)[::2]))
# unsupported element type
raises("int16", lambda: comm.all_reduce(np.zeros(4, np.int16)))
# not a buffer at all
raises("list", lambda: comm.all_reduce([1.0, 2.0]))
# root out of range, tag out of range, peer out of range
raises("root", lambda: comm.broadcast(out, root=n))
raises("tag", lambda: comm.send(send, 0, tag=-1))
raises("peer", lambda: comm.send(send, n))
raises("bad op", lambda: comm.all_reduce(send, out, op="median"))
raises("all_gather size", lambda: comm.all_gather(send, np.zeros(8 * n + 1, np.float32)))
raises("counts", lambda: comm.all_to_allv(send, out, [1]))


class FakeDevice:
    """Claims (`__cuda_array_interface__` v3) that host memory is a CUDA array."""

    def __init__(self, host, **extra):
        self.host = host
        self.__cuda_array_interface__ = dict(
            shape=host.shape, typestr=host.dtype.str, data=(host.ctypes.data, False), version=3, strides=None, stream=None
        )
        self.__cuda_array_interface__.update(extra)


host = np.zeros(4, np.float32)
# Host memory posing as device memory: refused, naming host memory (with a CUDA driver) or the
# missing driver (without one), before anything moves.
# The message names this rank (the check runs before the communicator is asked).
msg = raises("host memory as device memory", lambda: comm.all_reduce(FakeDevice(host)), (sucl.InvalidArgumentError, sucl.BackendUnavailableError))
assert ("host memory" in msg or "driver" in msg) and msg.startswith(f"rank {r}:"), msg
msg = raises("host memory as device recv", lambda: comm.all_reduce(FakeDevice(host), FakeDevice(np.zeros(4, np.float32))), (sucl.InvalidArgumentError, sucl.BackendUnavailableError))
assert ("host memory" in msg or "driver" in msg) and msg.startswith(f"rank {r}:"), msg
# Layouts and element types sucl cannot take are refused whatever the memory is.
msg = raises("strided device array", lambda: comm.all_reduce(FakeDevice(host, strides=(8,))))
assert "contiguous" in msg, msg
msg = raises("device int16", lambda: comm.all_reduce(FakeDevice(np.zeros(4, np.int16))))
assert "typestr" in msg, msg
assert (out == -1.0).all(), f"rank {r}: out changed: {out}"

# Nothing moved, nothing was left half-done: a good call agrees on every rank.
comm.all_reduce(send, out)
want = sum(np.arange(8, dtype=np.float32) + q for q in range(n))
assert np.array_equal(out, want), out
print(f"OK rank {r}")
comm.close()
