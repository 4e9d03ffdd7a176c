#!/bin/bash
# The small all_reduce path (micro.rs: f32 sum of 2..64 elements, ITERS calls per size, shm),
# one program built against the library at several commits, at several rank counts.
# Rounds alternate between the builds; each cell is the median over rounds of the mean time per
# call (max over ranks). 1 rank runs the program alone (a world of one: the runtime's per-call
# cost without any peer); the others run under each build's own launcher.
# usage: R=9 RANKS="1 2 8 16" ITERS=200000 micro-ranks.sh label:launcher:micro ...
#   e.g. micro-ranks.sh d651309:bin/sucl-d651309:bin/micro-d651309 main:bin/sucl-main:bin/micro-main \
#        hotpath:bin/sucl-hotpath:bin/micro-hotpath
R=${R:-9}; RANKS=${RANKS:-"1 2 8 16"}; ITERS=${ITERS:-200000}
T=$(mktemp /tmp/micro-ranks.XXXXXX)
for r in $(seq 1 "$R"); do
  for n in $RANKS; do
    for spec in "$@"; do
      IFS=: read -r lab launcher micro <<<"$spec"
      if [ "$n" = 1 ]; then
        SUCL_BACKEND=shm ITERS=$ITERS timeout 120 "$micro" 2>/dev/null
      else
        SUCL_BACKEND=shm ITERS=$ITERS timeout 300 "$launcher" run --ranks "$n" -- "$micro" 2>/dev/null
      fi | sed "s/^\[[0-9]*\] //; s/^/$n $lab /" >> "$T"
    done
  done
done
python3 - "$T" "$@" <<'PY'
import statistics as st, sys
labs = [s.split(':')[0] for s in sys.argv[2:]]
d = {}
for l in open(sys.argv[1]):
    f = l.split()
    if len(f) == 4:
        d.setdefault((int(f[0]), int(f[2]), f[1]), []).append(float(f[3]))
for n in sorted({k[0] for k in d}):
    print(f"\n{n} rank(s), µs per call (median of rounds; ratio to {labs[0]})\n")
    print("| bytes | " + " | ".join(labs) + " |")
    print("|---:|" + "---:|" * len(labs))
    for b in sorted({k[1] for k in d if k[0] == n}):
        base = st.median(d[(n, b, labs[0])]) if (n, b, labs[0]) in d else float('nan')
        cells = []
        for x in labs:
            v = d.get((n, b, x))
            cells.append("-" if not v else f"{st.median(v):.3f}" + ("" if x == labs[0] else f" ({st.median(v)/base:.2f})"))
        print(f"| {b} | " + " | ".join(cells) + " |")
    print("n per cell:", {x: len(d.get((n, 8, x), [])) for x in labs})
PY
rm -f "$T"
