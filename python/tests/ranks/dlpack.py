"""Buffers that offer only DLPack (`__dlpack__` / `__dlpack_device__`, no buffer protocol),
used in place: an all_reduce out of place, a broadcast in place, a send/recv into a view at an
offset, checked against NumPy; strided or unsupported ones raise before anything moves."""

import sys

import numpy as np

import sucl


class OnlyDLPack:
    """Exports a NumPy array's memory through DLPack alone."""

    def __init__(self, array):
        self._array = array

    def __dlpack__(self, stream=None, **kwargs):
        return self._array.__dlpack__()

    def __dlpack_device__(self):
        return self._array.__dlpack_device__()


comm = sucl.init()
r, n = comm.rank, comm.size
assert memoryview not in type(OnlyDLPack(np.zeros(1))).__mro__

send = np.arange(1000, dtype=np.float64) * (r + 1)
recv = np.zeros(1000)
comm.all_reduce(OnlyDLPack(send), OnlyDLPack(recv))
assert np.array_equal(recv, np.arange(1000) * sum(range(1, n + 1))), "all_reduce through DLPack"

b = np.full((4, 5), r, dtype=np.int32)
comm.broadcast(OnlyDLPack(b), root=n - 1)
assert (b == n - 1).all(), "broadcast in place through DLPack"

whole = np.zeros(16, np.float32)
if r == 0:
    comm.send(OnlyDLPack(np.arange(10, dtype=np.float32)), 1, tag=4)
elif r == 1:
    got = comm.recv(OnlyDLPack(whole[6:]), 0, tag=4)  # a view at a 24-byte offset
    assert got == 10 and np.array_equal(whole[6:], np.arange(10)) and not whole[:6].any(), whole

for bad, why in [(np.zeros(8)[::2], "C-contiguous"), (np.zeros(4, np.int16), "no sucl type")]:
    try:
        comm.all_reduce(OnlyDLPack(bad))
    except sucl.InvalidArgumentError as e:
        assert why in str(e), e
    else:
        sys.exit(f"{bad.dtype} {bad.strides} was accepted")
comm.barrier()
print(f"OK rank {r} of {n}", flush=True)
