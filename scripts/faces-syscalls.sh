#!/usr/bin/env bash
# System calls per Faces share on host ranks, per thread (main, host-queue worker, progress engine),
# from `perf trace -s` over two runs that differ only in the number of shares (so setup cancels).
# Counts depend little on machine noise, unlike times.
# usage: FACES=path/to/faces [SUCL=path/to/sucl] [R=2] [L="2 1 1"] [M="4 4 4 4"] [RUNFLAGS=--no-bind] scripts/faces-syscalls.sh
set -euo pipefail
FACES=${FACES:?set FACES to a faces example binary}
SUCL=${SUCL:-target/release/sucl}; R=${R:-2}; L=${L:-2 1 1}; M=${M:-4 4 4 4}
NJ=${NJ:-2}; SHORT=${SHORT:-20}; LONG=${LONG:-120}
W=$(mktemp -d /tmp/faces-sys.XXXXXX); trap 'rm -rf "$W"' EXIT
for ni in $SHORT $LONG; do
  perf trace -s -o "$W/$ni.txt" -- "$SUCL" run -n "$R" ${RUNFLAGS:-} -- "$FACES" $L $M 1 $NJ $ni | grep -E "passed|FAILED|/ baseline" | sed "s/^/  ni=$ni: /"
done
python3 "$(dirname "$0")/faces_syscalls.py" "$W/$SHORT.txt" "$W/$LONG.txt" $(( (NJ + 1) * (LONG - SHORT) )) "$(basename "$FACES")"
