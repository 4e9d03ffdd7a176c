"""Helpers for the multi-process tests: `sucl run` and torchrun jobs with a hard time limit."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
RANKS = Path(__file__).resolve().parent / "ranks"


def sucl_binary():
    """The `sucl` launcher: $SUCL_BIN, else the workspace's build, else PATH."""
    for cand in [os.environ.get("SUCL_BIN"), REPO / "target/debug/sucl", REPO / "target/release/sucl", shutil.which("sucl")]:
        if cand and Path(cand).is_file():
            return str(cand)
    pytest.fail("no sucl launcher: build it (cargo build -p sucl-cli) or set SUCL_BIN")


def run_job(argv, timeout=120, env=None):
    """Runs a job and returns (returncode, stdout + stderr); kills the whole process group on timeout."""
    full_env = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=full_env, start_new_session=True)
    try:
        out, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, 9)
        out, _ = p.communicate()
        pytest.fail(f"job timed out after {timeout}s: {argv}\n{out}")
    return p.returncode, out


def sucl_run(n, script, *args, timeout=120, env=None, grace=2):
    """`sucl run -n N --grace G -- python ranks/<script> args...`."""
    argv = [sucl_binary(), "run", "-n", str(n), "--grace", str(grace), "--", sys.executable, str(RANKS / script), *map(str, args)]
    return run_job(argv, timeout=timeout, env=env)


def torchrun(n, script, *args, timeout=300, env=None):
    """`torchrun --standalone --nproc-per-node N ranks/<script> args...`."""
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(n), str(RANKS / script), *map(str, args)]
    return run_job(argv, timeout=timeout, env=env)
