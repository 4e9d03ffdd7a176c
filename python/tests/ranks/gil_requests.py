"""Requests completing while the GIL is released: per round, the main thread posts a ring of
irecv/isend and a few iall_reduce calls; two threads wait on each request at once (the same
handle), while compute threads run pure-Python loops that need the GIL. Every result is checked
against a reference (receives' counts and data, the sums), and every thread must end: a thread
still alive after its join's bound is a hang. Run on 2 or more ranks."""

import os
import threading

import numpy as np

import sucl

ROUNDS, COLLECTIVES, N = 20, 4, 1000
comm = sucl.init()
r, n = comm.rank, comm.size
nxt, prv = (r + 1) % n, (r - 1) % n
stop = threading.Event()
errors = []


def compute(k):
    """Pure-Python work (holds the GIL between bytecodes); checks its own arithmetic."""
    rounds = 0
    while not stop.is_set():
        total = sum(i * i for i in range(2000))
        if total != 1999 * 2000 * 3999 // 6:
            errors.append(f"compute {k}: {total}")
        rounds += 1


def waiter(req, results, key):
    try:
        results[key] = req.wait()
    except Exception as e:  # reported below, with the request it came from
        errors.append(f"wait {key}: {type(e).__name__}: {e}")


def give_up(why):
    """Ends this rank at once: threads stuck in a wait must not keep the process alive."""
    print(f"rank {r}: {why}; errors: {errors[:5]}", flush=True)
    os._exit(1)


computers = [threading.Thread(target=compute, args=(k,), daemon=True) for k in range(2)]
for t in computers:
    t.start()
for rnd in range(ROUNDS):
    got = np.full(N, -1, np.int64)
    sent = np.arange(N, dtype=np.int64) + 1000 * r + rnd
    reqs = {"recv": comm.irecv(got, prv, tag=rnd), "send": comm.isend(sent, nxt, tag=rnd)}
    sums = []
    for c in range(COLLECTIVES):
        out = np.full(N, -1, np.int64)
        sums.append(out)
        reqs[f"all_reduce{c}"] = comm.iall_reduce(np.arange(N, dtype=np.int64) + r + c, out)
    results = {}
    waiters = [threading.Thread(target=waiter, args=(q, results, (k, i)), daemon=True) for k, q in reqs.items() for i in range(2)]
    for t in waiters:
        t.start()
    for t in waiters:
        t.join(timeout=120)
        if t.is_alive():
            give_up(f"round {rnd}: a wait did not return in 120 s (a hang)")
    for i in range(2):
        if results.get(("recv", i)) != N:
            errors.append(f"round {rnd}: irecv waiter {i} got count {results.get(('recv', i))}")
    if not np.array_equal(got, np.arange(N, dtype=np.int64) + 1000 * prv + rnd):
        errors.append(f"round {rnd}: received {got[:4]}... from rank {prv}")
    for c, out in enumerate(sums):
        want = n * np.arange(N, dtype=np.int64) + n * (n - 1) // 2 + n * c
        if not np.array_equal(out, want):
            errors.append(f"round {rnd}: all_reduce {c} gave {out[:4]}..., want {want[:4]}...")
stop.set()
for t in computers:
    t.join(timeout=60)
    if t.is_alive():
        give_up("a compute thread did not end")
comm.close()
if errors:
    give_up(f"{len(errors)} errors")
print(f"OK rank {r}: {ROUNDS} rounds, {2 * (2 + COLLECTIVES)} waiters each", flush=True)
