#!/usr/bin/env bash
# Regenerates the reference pages in docs/reference/ from the code:
#   settings.md    every setting, from the table in crates/sucl-runtime/src/settings.rs
#   cli.md         `sucl` and `sucld` --help, from their clap definitions
#   c-api.md       crates/sucl-capi/include/sucl.h's declarations and doc comments
#   python-api.md  python/sucl's stubs and docstrings
# usage: scripts/gen-docs.sh           rewrite the pages
#        scripts/gen-docs.sh --check   rewrite nothing; fail, naming each page that differs from
#                                      what the code gives ("... is stale: run scripts/gen-docs.sh")
# Builds the debug `sucl` and `sucld` (cargo's cache makes that quick after `cargo test`).
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
  -h | --help) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  --check) check=1 ;;
  "") check=0 ;;
  *) echo "gen-docs.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
esac
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
cargo build -q -p sucl-cli --bin sucl -p sucl-remote --bin sucld
bin="${CARGO_TARGET_DIR:-target}/debug"
status=0
# settings.md: the table's own test compares the page (and rewrites it with SUCL_REGEN_DOCS=1).
if [ "$check" = 1 ]; then
  cargo test -q -p sucl-runtime --lib settings::tests::settings_page_is_current >"$out/settings.log" 2>&1 \
    || { grep -h "stale\|panicked" "$out/settings.log" >&2 || cat "$out/settings.log" >&2; status=1; }
else
  SUCL_REGEN_DOCS=1 cargo test -q -p sucl-runtime --lib settings::tests::settings_page_is_current >/dev/null
fi
python3 scripts/gen_reference.py --sucl "$bin/sucl" --sucld "$bin/sucld" --out "$out/pages"
mkdir -p docs/reference
for page in cli.md c-api.md python-api.md; do
  if [ "$check" = 1 ]; then
    if ! cmp -s "$out/pages/$page" "docs/reference/$page"; then
      diff -u "docs/reference/$page" "$out/pages/$page" | head -30 >&2 || true
      echo "docs/reference/$page is stale: run scripts/gen-docs.sh" >&2
      status=1
    fi
  else
    cp "$out/pages/$page" "docs/reference/$page"
  fi
done
[ "$check" = 1 ] && [ "$status" -eq 0 ] && echo "gen-docs: docs/reference/ is current"
exit "$status"
