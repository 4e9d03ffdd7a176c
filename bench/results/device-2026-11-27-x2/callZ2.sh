#!/bin/bash
# Call Z2 (same machine as Z1): how often the first size of a short 16-rank shm run stalls (Z1's sweep had one
# 8 B row at 103 µs): 12 alternating launches of each binary, 8-64 B, 200 calls after 20 warm-up calls, as the sweep.
set -u
export NCCL_NVLS_ENABLE=0
Z=devbin/z; RES=$OUT/res; mkdir -p $RES
for i in $(seq 1 12); do
  for b in s-d651309 sucl-final; do
    timeout 60 $Z/$b bench all_reduce --ranks 16 --backend shm --min-bytes 8 --max-bytes 64 --iters 200 --warmup 20 --json > $RES/$b-$i.jsonl 2> $RES/$b-$i.err
  done
done
python3 - $RES <<'PY'
import json, sys, glob, os
res = sys.argv[1]
for b in ["s-d651309", "sucl-final"]:
    rows = {}
    for i in range(1, 13):
        for line in open(f"{res}/{b}-{i}.jsonl"):
            try: j = json.loads(line)
            except ValueError: continue
            if "bytes" in j: rows.setdefault(j["bytes"], []).append(j["time_us"])
    for s, ts in sorted(rows.items()):
        print(b, s, "µs per launch:", " ".join(f"{t:.2f}" for t in ts))
PY
tar czf $OUT/res.tgz -C $RES .
