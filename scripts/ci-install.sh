#!/usr/bin/env bash
# The installs people expect, checked:
#   1. every crate packages (cargo package --workspace --no-verify: metadata, versions of path
#      dependencies, the files that go in; building each package again is left to the
#      workspace build);
#   2. `cargo install --path` installs `sucl` and `sucld` (into a temporary root, reusing
#      target/ through CARGO_TARGET_DIR) and both answer --version and --help;
#   3. with --python: the Python package builds from its sdist (maturin sdist, then pip install
#      from the sdist into a fresh virtual environment; `import sucl` works), and its wheel
#      passes `auditwheel show` for the manylinux tag MANYLINUX (default manylinux_2_34, the
#      oldest glibc the wheel's symbols allow on this build host; see docs/guide/python.md).
#      A release build of the whole stack from the sdist's sources: minutes, so it is optional.
# usage: scripts/ci-install.sh [--python]
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
  -h | --help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
  --python | "") ;;
  *) echo "ci-install.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
esac
export CARGO_TERM_COLOR=never
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

echo "== ci-install: cargo package --workspace"
cargo package --workspace --no-verify --allow-dirty -q 2>"$tmp/package.log" || { cat "$tmp/package.log" >&2; exit 1; }
ls target/package/*.crate

echo "== ci-install: cargo install --path (sucl, sucld)"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"
cargo install -q --locked --path crates/sucl-cli --root "$tmp/root"
cargo install -q --locked --path crates/sucl-remote --root "$tmp/root"
for b in sucl sucld; do
  "$tmp/root/bin/$b" --version
  "$tmp/root/bin/$b" --help >/dev/null
done

if [ "${1:-}" = --python ]; then
  tag="${MANYLINUX:-manylinux_2_34}"
  echo "== ci-install: Python sdist, install from it, auditwheel ($tag)"
  python3 -m venv "$tmp/venv"
  "$tmp/venv/bin/python" -m pip install -q --upgrade pip maturin auditwheel
  (cd python && "$tmp/venv/bin/maturin" sdist -o "$tmp/dist")
  sdist=$(ls "$tmp"/dist/sucl-*.tar.gz)
  echo "sdist: $(basename "$sdist") ($(tar tzf "$sdist" | wc -l) files)"
  "$tmp/venv/bin/python" -m pip wheel -q --no-deps -w "$tmp/wheel" "$sdist"
  "$tmp/venv/bin/python" -m pip install -q --no-deps "$tmp"/wheel/sucl-*.whl
  (cd "$tmp" && "$tmp/venv/bin/python" -c 'import sucl; c = sucl.init(); print("import sucl: rank", c.rank, "of", c.size); c.close()')
  "$tmp/venv/bin/auditwheel" show "$tmp"/wheel/sucl-*.whl | tee "$tmp/auditwheel.txt"
  grep -q "\"$tag" "$tmp/auditwheel.txt" || grep -q "$tag" "$tmp/auditwheel.txt" \
    || { echo "ci-install: the wheel is not $tag-compatible (auditwheel show above)" >&2; exit 1; }
fi
echo "ci-install: all passed"
