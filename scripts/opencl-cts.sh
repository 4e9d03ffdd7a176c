#!/usr/bin/env bash
# Runs a suite of the Khronos OpenCL conformance tests (KhronosGroup/OpenCL-CTS, built against
# the ICD loader) two ways: on the local PoCL directly, and through sucl (libsucl_opencl.so ->
# a sucld on loopback with TLS and a token -> the same PoCL). Every test runs as its own
# process under a time limit, so a hang or a crash costs one test, not the suite. Prints a
# table (suite, PoCL pass/fail/skip/crash/hang, sucl the same) and the tests that pass on PoCL
# but not through sucl; the per-test results are kept as TSV files for comparison.
set -euo pipefail

usage() {
  cat <<'EOF'
usage: scripts/opencl-cts.sh [options] CTS_BUILD_DIR SUITE [TEST...]

Runs test_conformance/SUITE/test_SUITE of a built OpenCL-CTS, each test (all of the suite's,
or the TESTs named) in its own process, on PoCL directly and through sucl.

options:
  --timeout SECONDS   limit per test and way (default 300); a test over it counts as "hang"
  --only pocl|sucl    run one way only (the table shows what OUT_DIR holds)
  --out OUT_DIR       where results and logs go (default ./cts-results)
  --sucld PATH        the daemon (default target/release/sucld)
  --icd PATH          the ICD library (default target/release/libsucl_opencl.so)
  --daemon-arg ARG    one more option for sucld (repeatable), e.g. --daemon-arg=--max-session-bytes=8589934592
  --served-icd FILE   the one vendor (.icd file or library) both ways see, e.g.
                      /etc/OpenCL/vendors/nvidia.icd (default: every platform of the loader)
  --jobs N            tests run at once in each way (default 1)
  --table             print the table of what OUT_DIR holds for SUITE and run nothing
  -h, --help          this text

The "pocl" way is the served platform directly (PoCL by default; NVIDIA's with --served-icd).
Results: OUT_DIR/SUITE.pocl.tsv and OUT_DIR/SUITE.sucl.tsv (test <TAB> pass|fail|skip|crash|hang
<TAB> seconds), logs in OUT_DIR/logs/SUITE/{pocl,sucl}/TEST.log, the daemon's log in
OUT_DIR/logs/SUITE/sucld.log. POCL_MAX_PTHREAD_COUNT (default 2) applies to both ways.
Exit status: 0 when nothing that passes on PoCL fails through sucl, 1 otherwise, 2 on bad use.
EOF
}

repo="$(cd "$(dirname "$0")/.." && pwd)"
timeout_s=300
only=""
out="cts-results"
sucld="$repo/target/release/sucld"
icd="$repo/target/release/libsucl_opencl.so"
table_only=0
daemon_args=()
served_icd=""
jobs=1
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --timeout) timeout_s="$2"; shift 2 ;;
    --only) only="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --sucld) sucld="$2"; shift 2 ;;
    --icd) icd="$2"; shift 2 ;;
    --table) table_only=1; shift ;;
    --daemon-arg) daemon_args+=("$2"); shift 2 ;;
    --daemon-arg=*) daemon_args+=("${1#--daemon-arg=}"); shift ;;
    --served-icd) served_icd="$2"; shift 2 ;;
    --jobs) jobs="$2"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    -*) echo "opencl-cts: unknown option $1" >&2; usage >&2; exit 2 ;;
    *) args+=("$1"); shift ;;
  esac
done
if [ ${#args[@]} -lt 2 ]; then usage >&2; exit 2; fi
cts="${args[0]}"
suite="${args[1]}"
named=("${args[@]:2}")
case "$only" in ""|pocl|sucl) ;; *) echo "opencl-cts: --only takes pocl or sucl, not '$only'" >&2; exit 2 ;; esac
case "$timeout_s" in ''|*[!0-9]*) echo "opencl-cts: --timeout takes whole seconds, not '$timeout_s'" >&2; exit 2 ;; esac
case "$jobs" in ''|*[!0-9]*|0) echo "opencl-cts: --jobs takes a positive number, not '$jobs'" >&2; exit 2 ;; esac
if [ -n "$served_icd" ] && [ ! -e "$served_icd" ]; then echo "opencl-cts: no $served_icd" >&2; exit 2; fi
# What the served platform's users see: one vendor (both loaders' variables), or all of them.
# shellcheck source=scripts/lib/opencl-vendor.sh
source "$repo/scripts/lib/opencl-vendor.sh"
served_env_for "$served_icd"
bin="$cts/test_conformance/$suite/test_$suite"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
export POCL_MAX_PTHREAD_COUNT="${POCL_MAX_PTHREAD_COUNT:-2}"

# The table: one line per way, then what passes on PoCL and not through sucl.
print_table() {
  local pocl="$out/$suite.pocl.tsv" sucl="$out/$suite.sucl.tsv"
  printf '%-10s %-5s %5s %5s %5s %5s %5s %5s\n' suite way tests pass fail skip crash hang
  for way in pocl sucl; do
    local f="$out/$suite.$way.tsv"
    [ -f "$f" ] || continue
    awk -F'\t' -v s="$suite" -v w="$way" '
      { n++; c[$2]++ }
      END { printf "%-10s %-5s %5d %5d %5d %5d %5d %5d\n", s, w, n, c["pass"], c["fail"], c["skip"], c["crash"], c["hang"] }' "$f"
  done
  if [ -f "$pocl" ] && [ -f "$sucl" ]; then
    local worse skipped
    worse="$(awk -F'\t' 'NR == FNR { if ($2 == "pass") p[$1] = 1; next }
                         ($1 in p) && $2 != "pass" && $2 != "skip" { printf "  %s (%s through sucl)\n", $1, $2 }' "$pocl" "$sucl")"
    # A test skips itself where the sucl platform reports less (OpenCL 1.2, no images, ...).
    skipped="$(awk -F'\t' 'NR == FNR { if ($2 == "pass") p[$1] = 1; next }
                           ($1 in p) && $2 == "skip" { printf " %s", $1 }' "$pocl" "$sucl")"
    [ -z "$skipped" ] || echo "passes on PoCL, skips itself through sucl:$skipped"
    if [ -n "$worse" ]; then
      echo "passes on PoCL, fails through sucl:"
      echo "$worse"
      return 1
    fi
    echo "passes on PoCL, fails through sucl: none"
  fi
  return 0
}

if [ "$table_only" = 1 ]; then print_table; exit $?; fi
[ -x "$bin" ] || { echo "opencl-cts: no test binary $bin (build OpenCL-CTS first)" >&2; exit 2; }

if [ ${#named[@]} -gt 0 ]; then
  tests=("${named[@]}")
else
  mapfile -t tests < <(env "${served_env[@]}" "$bin" --list | sed -n 's/^\t\([A-Za-z0-9_]*\)$/\1/p')
fi
[ ${#tests[@]} -gt 0 ] || { echo "opencl-cts: $bin lists no tests" >&2; exit 2; }

tmp="$(mktemp -d)"
daemon_pid=""
cleanup() {
  if [ -n "$daemon_pid" ]; then
    kill "$daemon_pid" 2>/dev/null || true
    wait "$daemon_pid" 2>/dev/null || true
  fi
  rm -rf "$tmp"
}
trap cleanup EXIT

# Starts sucld serving PoCL on loopback and sets the client's environment (sucl_env).
start_daemon() {
  local fifo="$tmp/sucld.out"
  rm -f "$fifo"
  mkfifo "$fifo"
  env "${served_env[@]}" "$sucld" --listen 127.0.0.1:0 --opencl --host-devices 0 --tls-ephemeral \
    --print-address --token-file "$tmp/token" "${daemon_args[@]}" >"$fifo" 2>>"$logs/sucld.log" &
  daemon_pid=$!
  local address pin
  exec 3<"$fifo"
  if ! read -r -t 60 address <&3 || ! read -r -t 60 pin <&3; then
    exec 3<&-
    echo "opencl-cts: sucld did not print its address and pin (see $logs/sucld.log)" >&2
    exit 1
  fi
  # Keep draining the daemon's standard output so it never blocks on a full pipe.
  cat <&3 >>"$logs/sucld.log" &
  exec 3<&-
  sucl_env=(OCL_ICD_VENDORS="$icd" OCL_ICD_FILENAMES="$icd" SUCL_REMOTE="${address#listening on }" SUCL_REMOTE_TLS_PIN="${pin#tls pin }"
            SUCL_REMOTE_TOKEN_FILE="$tmp/token" SUCL_OPENCL_TIMEOUT=60)
}

# Runs one test one way under the time limit; appends "test, result, seconds" to TSV.
run_test() {
  local way=$1 t=$2 tsv=$3 rc result start secs log
  log="$logs/$way/$t.log"
  start=$(date +%s)
  set +e
  if [ "$way" = sucl ]; then
    env -u SUCL_CONFIG -u SUCL_REMOTE_TOKEN "${sucl_env[@]}" timeout -k 10 "$timeout_s" "$bin" "$t" >"$log" 2>&1 </dev/null
  else
    env "${served_env[@]}" timeout -k 10 "$timeout_s" "$bin" "$t" >"$log" 2>&1 </dev/null
  fi
  rc=$?
  set -e
  secs=$(($(date +%s) - start))
  if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
    result=hang
  elif [ $rc -gt 128 ]; then
    result=crash
  # The harness says "<test> passed" (sometimes after a warning without a line end).
  elif grep -q -E "(^|[^A-Za-z0-9_])$t (test not supported|test currently not implemented|skipped)" "$log" \
    || grep -q -E "^SKIPPED [0-9]+ of [0-9]+ tests" "$log"; then
    result=skip
  elif [ $rc -eq 0 ] && grep -q -E "(^|[^A-Za-z0-9_])$t passed$" "$log"; then
    result=pass
  else
    result=fail
  fi
  printf '%s\t%s\t%s\n' "$t" "$result" "$secs" >>"$tsv"
  printf '%-6s %-45s %-6s %4ss\n' "$way" "$t" "$result" "$secs"
}

# The tests running now (their pids), at most $jobs of them.
running=()
# Waits until fewer than LIMIT tests run (each is bounded by its own time limit).
wait_tests() {
  local limit=$1 done_pid p left
  while [ ${#running[@]} -ge "$limit" ] && [ ${#running[@]} -gt 0 ]; do
    done_pid=""
    wait -n -p done_pid "${running[@]}" || true
    # None of them is a child any longer (all reaped): nothing is left to wait for.
    if [ -z "$done_pid" ]; then running=(); break; fi
    left=()
    for p in "${running[@]}"; do [ "$p" = "$done_pid" ] || left+=("$p"); done
    running=("${left[@]}")
  done
}

# Runs every test one way, appending "test, result, seconds" to OUT_DIR/SUITE.WAY.tsv.
run_way() {
  local way="$1" tsv="$out/$suite.$way.tsv"
  logs="$out/logs/$suite"
  mkdir -p "$logs/$way"
  : >"$tsv"
  if [ "$way" = sucl ]; then
    [ -x "$sucld" ] || { echo "opencl-cts: no sucld at $sucld (cargo build --release -p sucl-remote --bin sucld)" >&2; exit 2; }
    [ -f "$icd" ] || { echo "opencl-cts: no ICD at $icd (cargo build --release -p sucl-opencl)" >&2; exit 2; }
    "$sucld" --gen-token "$tmp/token" >/dev/null
    : >"$logs/sucld.log"
    start_daemon
  fi
  local t
  for t in "${tests[@]}"; do
    if [ "$way" = sucl ] && ! kill -0 "$daemon_pid" 2>/dev/null; then
      echo "sucld exited before $t; starting another" | tee -a "$logs/sucld.log" >&2
      wait "$daemon_pid" 2>/dev/null || true
      start_daemon
    fi
    wait_tests "$jobs"
    run_test "$way" "$t" "$tsv" &
    running+=($!)
  done
  wait_tests 1
  sort -o "$tsv" "$tsv"
  if [ "$way" = sucl ]; then
    kill "$daemon_pid" 2>/dev/null || true
    wait "$daemon_pid" 2>/dev/null || true
    daemon_pid=""
  fi
}

for way in pocl sucl; do
  if [ -z "$only" ] || [ "$only" = "$way" ]; then run_way "$way"; fi
done
echo
print_table
