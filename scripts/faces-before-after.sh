#!/usr/bin/env bash
# Faces on host ranks, two builds side by side (BEFORE, AFTER), alternating per round so that both
# see the same machine state: 2, 4 and 8 ranks, the small and the P3HPC-like size. Prints, per
# case, the median over rounds of each build's baseline and triggered time per share and their
# triggered/baseline ratio (the target: <= 1), and each run's correctness line.
# usage: BEFORE=old/faces AFTER=new/faces [SUCL=target/release/sucl] [ROUNDS=3] [RANKS="2 4 8"]
#        [SIZES="4 4 4 4;15 14 13 12"] [SHARES="1 4 50"] [RUNFLAGS=--no-bind] scripts/faces-before-after.sh
set -uo pipefail
BEFORE=${BEFORE:?set BEFORE to the old faces binary}; AFTER=${AFTER:?set AFTER to the new faces binary}
SUCL=${SUCL:-target/release/sucl}; ROUNDS=${ROUNDS:-3}; RANKS=${RANKS:-2 4 8}
SIZES=${SIZES:-4 4 4 4;15 14 13 12}; SHARES=${SHARES:-1 4 50}
W=$(mktemp -d /tmp/faces-ba.XXXXXX); trap 'rm -rf "$W"' EXIT
grid() { case $1 in 2) echo "2 1 1";; 4) echo "2 2 1";; 8) echo "2 2 2";; *) echo "faces-before-after: no grid for $1 ranks" >&2; exit 1;; esac; }
IFS=';' read -ra SZ <<<"$SIZES"
for r in $RANKS; do
  for m in "${SZ[@]}"; do
    # The large size runs fewer shares per pass (a share takes milliseconds there).
    sh=$SHARES; [ "${m%% *}" -gt 8 ] && sh="1 2 20"
    input="$(grid "$r") $m $sh"
    for round in $(seq 1 "$ROUNDS"); do
      for v in before after; do
        b=$AFTER; [ $v = before ] && b=$BEFORE
        timeout 600 "$SUCL" run -n "$r" ${RUNFLAGS:-} -- "$b" $input >"$W/$v.$r.${m// /_}.$round.txt" 2>&1 || echo "FAILED: $v $r ranks \`$input\` (see below)" >&2
        grep -E "correctness|^\[0\] \{" "$W/$v.$r.${m// /_}.$round.txt" | grep -q "passed" || { echo "== $v $r ranks \`$input\` round $round:"; cat "$W/$v.$r.${m// /_}.$round.txt"; }
      done
    done
    python3 - "$W" "$r" "${m// /_}" "$input" "$ROUNDS" <<'PY'
import json, statistics, sys
w, r, m, inp, rounds = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
row = {}
for v in ("before", "after"):
    b, t = [], []
    for k in range(1, rounds + 1):
        for line in open(f"{w}/{v}.{r}.{m}.{k}.txt"):
            line = line.split("] ", 1)[-1]
            if line.startswith("{"):
                j = json.loads(line)
                b.append(j["baseline_us"]); t.append(j["triggered_us"])
    if b:
        mb, mt = statistics.median(b), statistics.median(t)
        row[v] = f"baseline {mb:9.1f} us  triggered {mt:9.1f} us  ratio {mt / mb:5.3f}"
    else:
        row[v] = "no result"
print(f"{r} ranks `{inp}` (median of {rounds}):\n  before: {row['before']}\n  after:  {row['after']}")
PY
  done
done
