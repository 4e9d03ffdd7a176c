#!/bin/bash
# usage: [WARMUP=5000] R=16 BACKEND=shm MINB=8 MAXB=256 ITERS=100000 ROUNDS=3 W=dir devbin/u/multi.sh BIN... > table.md
# Each round runs every binary in turn (order reversed every other round); median over rounds of the
# mean time per call (max over ranks); every row's #wrong is shown (max over rounds).
set -u
R=${R:-16}; BACKEND=${BACKEND:-shm}; MINB=${MINB:-8}; MAXB=${MAXB:-256}; ITERS=${ITERS:-100000}; ROUNDS=${ROUNDS:-3}
W=${W:-/tmp/multi}; rm -rf "$W"; mkdir -p "$W"
bins=("$@")
for round in $(seq 1 "$ROUNDS"); do
  order=("${bins[@]}")
  if [ $((round % 2)) = 0 ]; then order=($(printf '%s\n' "${bins[@]}" | tac)); fi
  for b in "${order[@]}"; do
    n=$(basename "$b")
    timeout 120 "$b" bench all_reduce --ranks "$R" --backend "$BACKEND" --min-bytes "$MINB" --max-bytes "$MAXB" \
      --iters "$ITERS" --warmup "${WARMUP:-5000}" --json > "$W/$n-$round.jsonl" 2> "$W/$n-$round.err"
  done
done
python3 - "$W" "$ROUNDS" "$R" "$BACKEND" "${bins[@]}" <<'PY'
import json, sys, os, statistics
W, R, ranks, be = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
bins = [os.path.basename(b) for b in sys.argv[5:]]
tab, wrong = {}, {}
for b in bins:
    for r in range(1, R + 1):
        try:
            lines = open(f"{W}/{b}-{r}.jsonl").read().splitlines()
        except FileNotFoundError:
            continue
        for line in lines:
            try:
                j = json.loads(line)
            except ValueError:
                continue
            if "bytes" not in j:
                continue
            t = j.get("time_us")
            if t is None:
                t = [v for k, v in j.items() if "time" in k][0]
                if "time_s" in j: t = j["time_s"] * 1e6
            tab.setdefault((j["bytes"], b), []).append(t)
            w = j.get("wrong")
            if w is not None: wrong[(j["bytes"], b)] = max(wrong.get((j["bytes"], b), 0), w)
sizes = sorted({k[0] for k in tab})
print(f"## all_reduce f32, {be}, {ranks} ranks: median of {R} rounds, µs (mean per call, max over ranks)\n")
print("| bytes | " + " | ".join(bins) + " |")
print("|---:|" + "---:|" * len(bins))
for s in sizes:
    print(f"| {s} | " + " | ".join(f"{statistics.median(tab[(s,b)]):.3f}" if (s, b) in tab else "-" for b in bins) + " |")
print(f"\n### median / median of {bins[0]}\n")
print("| bytes | " + " | ".join(bins[1:]) + " |")
print("|---:|" + "---:|" * (len(bins) - 1))
for s in sizes:
    if (s, bins[0]) not in tab: continue
    ref = statistics.median(tab[(s, bins[0])])
    print(f"| {s} | " + " | ".join(f"{statistics.median(tab[(s,b)])/ref:.2f}" if (s, b) in tab else "-" for b in bins[1:]) + " |")
print("\n### spread over rounds: slowest / fastest round\n")
print("| bytes | " + " | ".join(bins) + " |")
print("|---:|" + "---:|" * len(bins))
for s in sizes:
    print(f"| {s} | " + " | ".join(f"{max(tab[(s,b)])/min(tab[(s,b)]):.2f}" if (s, b) in tab else "-" for b in bins) + " |")
print("\nrounds per cell:", {b: len(tab.get((sizes[0], b), [])) for b in bins} if sizes else "none")
print("max #wrong (n/a: that build reports none):", {b: max([wrong[(s, b)] for s in sizes if (s, b) in wrong], default="n/a") for b in bins})
PY
