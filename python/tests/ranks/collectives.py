"""Every collective, blocking and non-blocking, on NumPy arrays, checked against NumPy."""

import numpy as np

import sucl

comm = sucl.init()
r, n = comm.rank, comm.size
DTYPES = [np.float32, np.float64, np.int32, np.int64, np.uint8, np.float16]


def data(rank, count, dtype, salt=0):
    """Rank `rank`'s deterministic input (small values, so sums and products stay exact)."""
    rng = np.random.default_rng(1000 * salt + rank)
    return rng.integers(1, 4, size=count).astype(dtype)


def same(got, want, what):
    if not np.array_equal(got, want):
        raise AssertionError(f"rank {r}: {what}: got {got[:8]} want {want[:8]}")


REDUCE = {"sum": lambda a: np.sum(a, axis=0), "prod": lambda a: np.prod(a, axis=0), "min": lambda a: np.min(a, axis=0), "max": lambda a: np.max(a, axis=0)}

for salt, dt in enumerate(DTYPES):
    for count in [1, 7, 1000, 70000]:
        ins = [data(q, count, dt, salt) for q in range(n)]
        allin = np.stack(ins)
        for name, ref in REDUCE.items():
            want = ref(allin).astype(dt)
            out = np.zeros(count, dt)
            comm.all_reduce(ins[r], out, op=name)
            same(out, want, f"all_reduce {name} {dt.__name__} {count}")
            x = ins[r].copy()
            comm.iall_reduce(x, op=getattr(sucl, name.upper())).wait()
            same(x, want, f"iall_reduce in place {name}")
            out = np.zeros(count, dt)
            comm.reduce(ins[r], out, op=name, root=n - 1)
            if r == n - 1:
                same(out, want, f"reduce {name}")
        # broadcast from every root
        for root in range(n):
            b = ins[r].copy()
            comm.broadcast(b, root=root)
            same(b, ins[root], "broadcast")
        b = ins[r].copy()
        comm.ibroadcast(b, root=n - 1).wait()
        same(b, ins[n - 1], "ibroadcast")
        # gather / all_gather / scatter / all_to_all / reduce_scatter
        cat = np.concatenate(ins)
        g = np.zeros(count * n, dt) if r == 0 else None
        comm.gather(ins[r], g, root=0)
        if r == 0:
            same(g, cat, "gather")
        ag = np.zeros(count * n, dt)
        comm.all_gather(ins[r], ag)
        same(ag, cat, "all_gather")
        ag2 = np.zeros(count * n, dt)
        ag2[r * count : (r + 1) * count] = ins[r]
        comm.iall_gather(None, ag2).wait()
        same(ag2, cat, "iall_gather in place")
        big = [data(q, count * n, dt, salt + 50) for q in range(n)]
        sc = np.zeros(count, dt)
        comm.scatter(big[1 % n] if r == 1 % n else None, sc, root=1 % n)
        same(sc, big[1 % n][r * count : (r + 1) * count], "scatter")
        a2a = np.zeros(count * n, dt)
        comm.all_to_all(big[r], a2a)
        same(a2a, np.concatenate([big[q][r * count : (r + 1) * count] for q in range(n)]), "all_to_all")
        rs = np.zeros(count, dt)
        comm.ireduce_scatter(big[r], rs, op="sum").wait()
        same(rs, np.sum(np.stack(big), axis=0).astype(dt)[r * count : (r + 1) * count], "reduce_scatter")

# v-collectives: rank q contributes q + 1 + k elements
k = 5
counts = [q + 1 + k for q in range(n)]
vins = [data(q, counts[q], np.float64, 77) for q in range(n)]
vcat = np.concatenate(vins)
gv = np.zeros(sum(counts), np.float64)
comm.gatherv(vins[r], gv if r == 0 else None, counts, root=0)
if r == 0:
    same(gv, vcat, "gatherv")
agv = np.zeros(sum(counts), np.float64)
comm.iall_gatherv(vins[r], agv, counts).wait()
same(agv, vcat, "all_gatherv")
svout = np.zeros(counts[r], np.float64)
comm.scatterv(vcat if r == 0 else None, svout, counts, root=0)
same(svout, vins[r], "scatterv")
# all_to_allv: i sends (i + j + 1) elements to j
table = [i + j + 1 for i in range(n) for j in range(n)]
sends = [data(i, sum(table[i * n : (i + 1) * n]), np.int64, 99) for i in range(n)]
recv = np.zeros(sum(table[i * n + r] for i in range(n)), np.int64)
comm.all_to_allv(sends[r], recv, table)
want = []
for i in range(n):
    off = sum(table[i * n : i * n + r])
    want.append(sends[i][off : off + table[i * n + r]])
same(recv, np.concatenate(want), "all_to_allv")

# point to point: a ring, blocking and non-blocking, with tags
right, left = (r + 1) % n, (r - 1) % n
msg = data(r, 33, np.float32, 5)
got = np.zeros(40, np.float32)
rq = comm.irecv(got, left, tag=7)
sq = comm.isend(msg, right, tag=7)
sq.wait()
assert rq.wait() == 33, "irecv count"
same(got[:33], data(left, 33, np.float32, 5), "isend/irecv ring")
if r == 0:
    comm.send(msg, right, tag=3)
    cnt = comm.recv(got, left, tag=3)
else:
    cnt = comm.recv(got, left, tag=3)
    comm.send(msg, right, tag=3)
assert cnt == 33
same(got[:33], data(left, 33, np.float32, 5), "send/recv ring")

# bytearray / memoryview / array.array through the buffer protocol
import array

ba = bytearray([r + 1] * 8)
comm.all_reduce(ba, op="max")
assert list(ba) == [n] * 8, list(ba)
arr = array.array("d", [float(r)] * 3)
comm.all_reduce(memoryview(arr))
assert list(arr) == [float(sum(range(n)))] * 3

# split: even and odd ranks
sub = comm.split(r % 2, key=-r)
v = np.array([r], np.int64)
sub.all_reduce(v)
assert v[0] == sum(q for q in range(n) if q % 2 == r % 2), v
assert sub.rank == sorted([q for q in range(n) if q % 2 == r % 2], reverse=True).index(r)
sub.close()
none = comm.split(None if r == 0 else 1)
assert (none is None) == (r == 0)

# A request keeps its buffers alive: the caller's only reference to each send array goes away
# before the wait (arrays this large are unmapped when freed).
outs, reqs = [], []
for k in range(4):
    outs.append(np.zeros(200_000))
    reqs.append(comm.iall_reduce(np.full(200_000, float(r + k)), outs[-1], op="sum"))
sucl.wait_all(reqs)
for k in range(4):
    same(outs[k], np.full(200_000, float(sum(range(n)) + n * k)), "iall_reduce of a dropped send array")
# Several non-blocking calls in flight, then a blocking one: it runs after them on every rank.
a, b = np.full(5, float(r)), np.full(5, 1.0)
ra = comm.iall_reduce(a)
rb = comm.ibroadcast(b if r == 0 else np.zeros(5), root=0)
c = np.full(5, 2.0)
comm.all_reduce(c)
same(c, np.full(5, 2.0 * n), "blocking after non-blocking")
assert ra.test() and rb.test()
same(a, np.full(5, float(sum(range(n)))), "queued iall_reduce")

comm.barrier()
comm.ibarrier().wait()
print(f"OK rank {r} of {n}")
comm.close()
