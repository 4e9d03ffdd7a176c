#!/usr/bin/env python3
"""Runs the shell blocks of README.md and docs/guide/*.md, so that a wrong flag or path fails CI.

Every ```sh / ```bash block runs, in order per file, as a bash script with `set -euo pipefail`
from the repository root, with HOME, TMPDIR and CARGO_INSTALL_ROOT in a fresh temporary
directory (whose bin/ is first on PATH, so `cargo install` blocks put `sucl` and `sucld` there;
target/release is last on PATH) and CARGO_TARGET_DIR at the repository's target/, under a time
limit; its whole process group is
ended when it runs out. A block preceded by a comment

    <!-- norun: WHY -->

is skipped; WHY must say why (at least a few words: "needs a GPU", "writes /opt"). A norun
marker without a reason is an error.

usage: run_doc_blocks.py [--list] [--timeout SECONDS] [FILE.md ...]
exit status: 0 when every block that runs succeeded, 1 otherwise.
"""

import argparse
import glob
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BLOCK = re.compile(r"(?:<!--\s*norun:?(?P<why>[^\n]*?)-->\s*\n)?```(?P<lang>sh|bash)\n(?P<body>.*?)```", re.S)


def blocks(path):
    text = open(path).read()
    for m in BLOCK.finditer(text):
        line = text[: m.start("lang")].count("\n") + 1
        marked = m.group("why") is not None
        yield line, marked, (m.group("why") or "").strip(), m.group("body")


def run(body, env, timeout, log):
    script = "set -euo pipefail\n" + body
    with open(log, "w") as out:
        p = subprocess.Popen(["bash", "-c", script], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                             stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            return p.wait(timeout=timeout), False
        except subprocess.TimeoutExpired:
            return None, True
        finally:
            # End whatever the block left running (its own process group), then reap the shell.
            for sig in (signal.SIGTERM, signal.SIGKILL):
                try:
                    os.killpg(p.pid, sig)
                except ProcessLookupError:
                    break
                time.sleep(0.5)
            p.wait()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="*", help="markdown files (default: README.md and docs/guide/*.md)")
    ap.add_argument("--list", action="store_true", help="list the blocks and whether they run; run nothing")
    ap.add_argument("--timeout", type=float, default=300, help="seconds each block may take (default 300)")
    a = ap.parse_args()
    files = a.files or [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs/guide/*.md")))
    failed, ran, skipped = [], 0, 0
    with tempfile.TemporaryDirectory(prefix="sucl-doc-blocks-") as tmp:
        env = dict(os.environ)
        for k in list(env):
            if k.startswith("SUCL_"):
                del env[k]
        env.update(
            HOME=os.path.join(tmp, "home"),
            TMPDIR=os.path.join(tmp, "tmp"),
            CARGO_INSTALL_ROOT=os.path.join(tmp, "root"),
            CARGO_TARGET_DIR=env.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target")),
            CARGO_HOME=env.get("CARGO_HOME", os.path.expanduser("~/.cargo")),
            RUSTUP_HOME=env.get("RUSTUP_HOME", os.path.expanduser("~/.rustup")),
        )
        # `sucl` and `sucld` as the README's install block puts them (first), else as built in
        # target/release (last), so that one page's blocks also run alone.
        env["PATH"] = os.pathsep.join(
            [os.path.join(tmp, "root", "bin"), env.get("PATH", ""), os.path.join(env["CARGO_TARGET_DIR"], "release")]
        )
        for d in ("home", "tmp", "root/bin"):
            os.makedirs(os.path.join(tmp, d), exist_ok=True)
        for path in files:
            rel = os.path.relpath(path, ROOT)
            for line, marked, why, body in blocks(path):
                where = f"{rel}:{line}"
                if marked:
                    if len(why.split()) < 2:
                        print(f"{where}: norun marker without a reason (write <!-- norun: why -->)")
                        failed.append(where)
                    else:
                        print(f"{where}: skipped ({why})")
                    skipped += 1
                    continue
                if a.list:
                    print(f"{where}: runs")
                    continue
                log = os.path.join(tmp, f"block-{ran}.log")
                t0 = time.time()
                status, timed_out = run(body, env, a.timeout, log)
                ran += 1
                took = time.time() - t0
                if status == 0:
                    print(f"{where}: ok ({took:.0f} s)")
                    continue
                why = f"timed out after {a.timeout:.0f} s" if timed_out else f"exit {status}"
                print(f"{where}: FAILED ({why}); the block:\n{body.rstrip()}\n--- its output (last 40 lines):")
                print("".join(open(log, errors="replace").readlines()[-40:]))
                failed.append(where)
    print(f"doc blocks: {ran} ran, {skipped} skipped, {len(failed)} failed" + (f": {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
