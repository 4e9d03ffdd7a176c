#!/usr/bin/env bash
# Runs the unit tests that exercise sucl's unsafe and untrusted-input code under valgrind's
# memcheck: sucl-core's engine, wire, dtype and store tests, and sucl-host's shared-memory ring
# tests (named `ring_*`). Any invalid read/write, use of uninitialized memory or definite leak
# fails the run (exit 1). Installs valgrind (Debian package) if missing.
#
#   scripts/valgrind-tests.sh            # PROPTEST_CASES defaults to 32 here (speed)
#   PROPTEST_CASES=256 scripts/valgrind-tests.sh
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v valgrind >/dev/null; then
  echo "installing valgrind"
  export DEBIAN_FRONTEND=noninteractive
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq valgrind >/dev/null
fi

export PROPTEST_CASES="${PROPTEST_CASES:-32}"
# Failure persistence writes files next to the sources; not wanted from a checking run.
export PROPTEST_DISABLE_FAILURE_PERSISTENCE=1

# The path of a crate's unit-test binary, built (debug: valgrind needs the symbols to report).
test_binary() {
  cargo test -p "$1" --lib --no-run --message-format=json 2>/dev/null \
    | grep -o '"executable":"[^"]*"' | head -n1 | cut -d'"' -f4
}

VG=(valgrind --tool=memcheck --error-exitcode=1 --leak-check=full --errors-for-leak-kinds=definite
    --show-leak-kinds=definite --track-origins=yes --num-callers=30 --quiet)

run() {
  local crate=$1
  shift
  cargo test -p "$crate" --lib --no-run --quiet
  local bin
  bin=$(test_binary "$crate")
  [ -x "$bin" ] || { echo "valgrind-tests: no test binary for $crate" >&2; exit 2; }
  echo "== valgrind: $crate ($*) PROPTEST_CASES=$PROPTEST_CASES"
  # One test thread: memcheck serializes threads anyway, and errors then name one test.
  "${VG[@]}" "$bin" --test-threads=1 "$@"
}

run sucl-core engine:: wire:: dtype:: store::
# The shm ring tests (3).
run sucl-host shm::tests::ring_
echo "valgrind-tests: memcheck found no errors"
