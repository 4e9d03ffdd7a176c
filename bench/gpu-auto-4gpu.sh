#!/usr/bin/env bash
# Figure gpu-auto-4gpu (device machine, RANKS GPUs, default 4): `sucl tune --device cuda` for
# all_reduce and broadcast (8 B-64 MiB, factor 4, crossovers refined), then each op benchmarked
# with that table beside its fixed backends (--compare nccl,ipc,auto, factor 2, best of 2 rounds),
# every row checked (#wrong). Writes OUT/tune.toml, OUT/tune.txt, OUT/{all_reduce,broadcast}.txt
# and OUT/gpu-auto-4gpu.csv: per op and size the times, the table's choice, and auto / the best
# of nccl and ipc.
# usage: [SUCL=target/release/sucl] [RANKS=4] [OUT=target/bench/auto4] bench/gpu-auto-4gpu.sh
case "${1:-}" in -h|--help) sed -n 2,8p "$0" | sed 's/^# \{0,1\}//'; exit 0;; esac
set -euo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 SUCL_REQUIRE_GPU=1
SUCL=${SUCL:-target/release/sucl}; RANKS=${RANKS:-4}; OUT=${OUT:-target/bench/auto4}
mkdir -p "$OUT"
"$SUCL" tune --device cuda --ranks "$RANKS" --ops all_reduce,broadcast --min-bytes 8 --max-bytes 64M --factor 4 \
  --iters 50 --rounds 2 --out "$OUT/tune.toml" >"$OUT/tune.txt"
for op in all_reduce broadcast; do
  "$SUCL" bench "$op" --device cuda --ranks "$RANKS" --config "$OUT/tune.toml" --min-bytes 8 --max-bytes 64M --factor 2 \
    --rounds 2 --iters 100 --warmup 10 --compare nccl,ipc,auto >"$OUT/$op.txt"
done
python3 - "$OUT" "$(dirname "$0")" <<'PY'
import os, sys, tomllib
out = sys.argv[1]
sys.path.insert(0, sys.argv[2])
from tocsv import ws_table
rules = tomllib.load(open(os.path.join(out, "tune.toml"), "rb")).get("tuning", [])
def choice(op, b):
    return next((r["backend"] for r in rules if r["op"] == op and r["bytes"][0] <= b < r["bytes"][1]), "")
with open(os.path.join(out, "gpu-auto-4gpu.csv"), "w") as f:
    f.write("op,bytes,nccl_us,ipc_us,auto_us,auto_choice,auto_over_best,wrong\n")
    for op in ("all_reduce", "broadcast"):
        head, body = ws_table(open(os.path.join(out, op + ".txt")).read().splitlines())
        for row in body:
            v = dict(zip(head, row))
            b, n, i, a = int(v["bytes"]), float(v["nccl"]), float(v["ipc"]), float(v["auto"])
            f.write(f"{op},{b},{n},{i},{a},{choice(op, b)},{a / min(n, i):.3f},{v['#wrong']}\n")
PY
cat "$OUT/gpu-auto-4gpu.csv"
