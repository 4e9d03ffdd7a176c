#!/usr/bin/env bash
# CI smoke of the fuzz targets (fuzz/): first every committed input (fuzz/corpus, and
# fuzz/findings: inputs that once failed) replayed through the same entry points as plain
# tests of the crates (cargo test --test fuzz_replay), then a short coverage-guided run of each
# target (scripts/fuzz.sh, SUCL_FUZZ_SECONDS seconds each, default 15). The instrumented build
# goes to ~/.cache/sucl-ci/fuzz-target, kept between runs; installs g++ (libFuzzer is C++) if
# missing. Exits non-zero on any failing input or finding.
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
  -h|--help) sed -n '2,7p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  "") ;;
  *) echo "ci-fuzz.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
esac
if ! command -v g++ >/dev/null; then
  echo "installing g++"
  export DEBIAN_FRONTEND=noninteractive
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq g++ >/dev/null
fi
echo "== fuzz corpora and findings replayed as tests"
for crate in sucl-core sucl-host sucl-remote sucl-runtime sucl-graph; do
  cargo test -q -p "$crate" --test fuzz_replay
done
echo "== coverage-guided runs, ${SUCL_FUZZ_SECONDS:-15} s per target"
export CARGO_TARGET_DIR="${SUCL_FUZZ_TARGET_DIR:-$HOME/.cache/sucl-ci/fuzz-target}"
scripts/fuzz.sh --seconds "${SUCL_FUZZ_SECONDS:-15}"
