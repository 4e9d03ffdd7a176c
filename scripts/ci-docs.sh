#!/usr/bin/env bash
# CI for the documentation: the pages that must match the code, and the commands the pages show.
#   1. docs/reference/ is current (scripts/gen-docs.sh --check: settings, CLI, C and Python API);
#   2. the Rust API docs build without a warning (cargo doc --workspace --no-deps, -D warnings);
#   3. the declared MSRV is one value: Cargo.toml's rust-version and clippy.toml's msrv (which
#      clippy's incompatible_msrv enforces in .ci/run's clippy runs);
#   4. every ```sh block of README.md and docs/guide/*.md that needs no GPU runs
#      (scripts/run_doc_blocks.py; blocks marked <!-- norun: why --> are skipped).
# The Rust samples of README.md and docs/guide/ are doctests of the sucl crate (crates/sucl/src/
# lib.rs, doc_samples), so `cargo test --workspace` compiles them (and runs those that need no GPU
# and no second rank); `cargo test -p sucl --doc` runs them alone.
# usage: scripts/ci-docs.sh [--skip-blocks]
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
  -h | --help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
esac
export CARGO_TERM_COLOR=never
step() { echo "== ci-docs: $*"; }

step "reference pages"
bash scripts/gen-docs.sh --check

step "cargo doc (warnings are errors)"
RUSTDOCFLAGS="-D warnings" cargo doc -q --keep-going --workspace --no-deps

step "MSRV"
msrv_cargo=$(sed -n 's/^rust-version = "\(.*\)"/\1/p' Cargo.toml)
msrv_clippy=$(sed -n 's/^msrv = "\(.*\)"/\1/p' clippy.toml)
if [ -z "$msrv_cargo" ] || [ "$msrv_cargo" != "$msrv_clippy" ]; then
  echo "ci-docs: Cargo.toml rust-version ($msrv_cargo) and clippy.toml msrv ($msrv_clippy) differ" >&2
  exit 1
fi
for toml in crates/*/Cargo.toml; do
  if grep -q '^rust-version = ' "$toml"; then
    echo "ci-docs: $toml sets its own rust-version; inherit the workspace's (rust-version.workspace = true)" >&2
    exit 1
  fi
done
echo "MSRV $msrv_cargo (clippy's incompatible_msrv checks the code against it)"

if [ "${1:-}" != "--skip-blocks" ]; then
  step "shell blocks of README.md and docs/guide/"
  python3 scripts/run_doc_blocks.py --timeout 420
fi
echo "ci-docs: all passed"
