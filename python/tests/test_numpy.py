"""The NumPy array API, with real processes under `sucl run`."""

import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
import sucl

from conftest import RANKS, run_job, sucl_run

np = pytest.importorskip("numpy")


@pytest.mark.parametrize("n", [2, 3])
def test_every_collective_matches_numpy(n):
    rc, out = sucl_run(n, "collectives.py", timeout=300)
    assert rc == 0, out
    for r in range(n):
        assert f"OK rank {r} of {n}" in out, out


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_every_collective_over_each_backend(transport):
    rc, out = sucl_run(2, "collectives.py", env={"SUCL_BACKEND": transport}, timeout=300)
    assert rc == 0, out


def test_bad_input_raises_before_data_moves():
    rc, out = sucl_run(2, "bad_input.py")
    assert rc == 0, out
    assert "OK rank 0" in out and "OK rank 1" in out, out


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_after_a_mismatch_later_calls_raise_unusable(transport):
    # tcp finds a count mismatch of an all_reduce only with the checking mode on.
    env = {"SUCL_BACKEND": transport, "SUCL_CHECK_COLLECTIVES": "1" if transport == "tcp" else "0"}
    rc, out = sucl_run(2, "after_failure.py", env=env)
    assert rc == 0, out
    assert "OK rank 0" in out and "OK rank 1" in out, out


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_requests_complete_while_other_threads_hold_the_gil(transport):
    rc, out = sucl_run(3, "gil_requests.py", env={"SUCL_BACKEND": transport}, timeout=300)
    assert rc == 0, out
    for r in range(3):
        assert f"OK rank {r}:" in out, out


def test_a_killed_rank_raises_on_every_survivor():
    # The launcher ends the job when a rank dies (SIGTERM, then SIGKILL after --grace): the
    # survivors ignore SIGTERM, so what they print is sucl's doing, not the launcher's.
    rc, out = sucl_run(3, "killed.py", env={"SUCL_TIMEOUT": "60"}, timeout=120, grace=30)
    assert rc != 0, out  # the launcher reports the killed rank
    for r in range(2):
        assert f"RAISED rank {r} " in out, out
    assert "NOT RAISED" not in out, out


def test_ctrl_c_interrupts_a_wait():
    p = subprocess.Popen([sys.executable, str(RANKS / "interrupt.py")], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert p.stdout.readline().strip() == "WAITING"
        time.sleep(0.3)
        p.send_signal(signal.SIGINT)
        out, _ = p.communicate(timeout=20)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert "INTERRUPTED" in out, out
    assert p.returncode == 0, out


def test_single_process_world_and_errors_hierarchy():
    import sucl

    assert issubclass(sucl.LostPeerError, sucl.SuclError)
    assert issubclass(sucl.SuclError, RuntimeError)
    with sucl.init() as comm:
        assert (comm.rank, comm.size) == (0, 1)
        x = np.arange(5, dtype=np.float64)
        y = np.zeros(5)
        comm.all_reduce(x, y, op=sucl.SUM)
        assert np.array_equal(x, y)
        assert comm.iall_reduce(x).test() in (True, False)
    with pytest.raises(sucl.InvalidArgumentError, match="closed"):
        comm.barrier()


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="no mpirun")
def test_every_collective_under_mpirun():
    # The wheel has no MPI: under mpirun the ranks meet at MASTER_ADDR:MASTER_PORT.
    port = sucl.unused_port()
    argv = ["mpirun", "-n", "2"] + (["--allow-run-as-root", "--oversubscribe"] if os.getuid() == 0 else [])
    argv += [sys.executable, str(RANKS / "collectives.py")]
    rc, out = run_job(argv, timeout=300, env={"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    assert rc == 0, out
    assert "OK rank 0 of 2" in out and "OK rank 1 of 2" in out, out


@pytest.mark.parametrize("mode", ["recv", "all_reduce", "iall_reduce"])
def test_ctrl_c_interrupts_a_blocked_call_and_aborts_the_job(mode):
    interrupt_blocked_rank(mode)


def interrupt_blocked_rank(mode):
    """Rank 0 blocks in a call rank 1 never joins; SIGINT must end it with KeyboardInterrupt
    long before SUCL_TIMEOUT, make later calls raise, and end rank 1's wait with the news."""
    address = f"127.0.0.1:{sucl.unused_port()}"
    env = dict(os.environ, SUCL_TIMEOUT="300", PYTHONUNBUFFERED="1")
    argv = [sys.executable, str(RANKS / "blocked.py")]
    ranks = [subprocess.Popen(argv + [str(r), address, mode], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env) for r in range(2)]
    try:
        assert ranks[0].stdout.readline().strip() == "BLOCKING"
        time.sleep(0.5)
        ranks[0].send_signal(signal.SIGINT)
        outs = [p.communicate(timeout=60)[0] for p in ranks]
    finally:
        for p in ranks:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert "KEYBOARDINTERRUPT" in outs[0], outs
    assert "LATER AbortedError: rank 0: communicator aborted: rank 0 was interrupted" in outs[0], outs
    assert "PEER AbortedError: rank 1: communicator aborted: rank 0 was interrupted" in outs[1], outs
    assert [p.returncode for p in ranks] == [0, 0], outs


def test_dlpack_only_objects_are_buffers():
    rc, out = sucl_run(2, "dlpack.py")
    assert rc == 0, out
    assert "OK rank 0 of 2" in out and "OK rank 1 of 2" in out, out
