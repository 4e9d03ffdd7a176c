#!/usr/bin/env bash
# Coverage-guided fuzzing of every decoder of bytes from outside a process (fuzz/: remote
# frames client<->daemon and daemon<->daemon, the rendezvous store, the tcp mesh handshake,
# c10d store replies, config and scenario TOML), with libFuzzer on the stable toolchain:
# libfuzzer-sys links libFuzzer, and rustc's sancov pass instruments the code (the flags
# cargo-fuzz would pass, without its nightly-only sanitizers). Each target runs SECONDS
# seconds (default 60) from fuzz/corpus/<target> plus fuzz/findings/<target> (inputs that once
# failed), in a scratch copy; new failing inputs are saved to fuzz/artifacts/<target>/. Prints
# executions, coverage and findings per target; exits 1 if any target found something.
#
#   scripts/fuzz.sh [--seconds N] [--merge] [TARGET...]   # all targets when none is named
#   --merge   adds the inputs that raised coverage to fuzz/corpus/<target> (minimized)
#   --build   only build the targets
#
# Needs a C++ compiler (libFuzzer is C++). Builds into fuzz/target (CARGO_TARGET_DIR moves it).
set -euo pipefail
self="$(cd "$(dirname "$0")" && pwd)/$(basename "$0")"
cd "$(dirname "$0")/../fuzz"

seconds=60
merge=0
build_only=0
targets=()
while [ $# -gt 0 ]; do
  case "$1" in
    -h|--help) sed -n '2,16p' "$self" | sed 's/^# \{0,1\}//'; exit 0 ;;
    --seconds) seconds="$2"; shift 2 ;;
    --merge) merge=1; shift ;;
    --build) build_only=1; shift ;;
    -*) echo "fuzz.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) targets+=("$1"); shift ;;
  esac
done
all_targets=(remote_frame remote_peer_frame store_frames mesh_handshake c10d_replies config_toml scenario_toml)
[ ${#targets[@]} -gt 0 ] || targets=("${all_targets[@]}")

triple="$(rustc -vV | sed -n 's/^host: //p')"
# --target keeps the instrumentation out of build scripts (they would not link without libFuzzer).
export RUSTFLAGS="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares --cfg fuzzing"
cargo build --release --locked --target "$triple" --bins
[ "$build_only" -eq 0 ] || exit 0
bin_dir="${CARGO_TARGET_DIR:-target}/$triple/release"

scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
found=0
printf '%-18s %10s %8s %8s %9s\n' target executions exec/s coverage findings
for t in "${targets[@]}"; do
  [ -x "$bin_dir/$t" ] || { echo "fuzz.sh: no target $t (see fuzz/Cargo.toml)" >&2; exit 2; }
  mkdir -p "corpus/$t" "findings/$t" "artifacts/$t" "$scratch/$t"
  cp -r "corpus/$t/." "findings/$t/." "$scratch/$t/" 2>/dev/null || true
  log="$scratch/$t.log"
  rc=0
  # -timeout: one input running 10 s is a hang (a finding); -rss_limit_mb: so is a runaway allocation.
  "$bin_dir/$t" "$scratch/$t" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=4096 \
    -print_final_stats=1 -artifact_prefix="artifacts/$t/" >"$log" 2>&1 || rc=$?
  execs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)"
  speed="$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)"
  cov="$(grep -oE 'cov: [0-9]+' "$log" | tail -1 | cut -d' ' -f2)"
  crashes="$(find "artifacts/$t" -type f | wc -l)"
  printf '%-18s %10s %8s %8s %9s\n' "$t" "${execs:-?}" "${speed:-?}" "${cov:-?}" "$crashes"
  if [ "$rc" -ne 0 ] || [ "$crashes" -ne 0 ]; then
    found=1
    echo "--- $t: exit $rc; the end of its log:" >&2
    tail -30 "$log" >&2
  fi
  if [ "$merge" -eq 1 ]; then
    "$bin_dir/$t" -merge=1 -max_len=4096 "corpus/$t" "$scratch/$t" >/dev/null 2>&1
  fi
done
exit "$found"
