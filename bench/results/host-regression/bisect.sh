#!/bin/bash
# usage: devbin/bisect.sh ROUNDS BIN... ; writes $OUT/bisect.txt
R=${1:-3}; shift
W=/tmp/bis; rm -rf $W; mkdir -p $W
for round in $(seq 1 $R); do
  for b in "$@"; do
    n=$(basename $b)
    timeout 120 $b bench all_reduce --ranks 2 --backend shm --min-bytes 8 --max-bytes ${SHM_MAXB:-256} --iters ${SHM_ITERS:-200000} --warmup 5000 --json > $W/$n-shm2-$round.jsonl 2>/dev/null
    timeout 120 $b bench all_reduce --ranks 4 --backend tcp --min-bytes 8 --max-bytes 16384 --iters ${TCP_ITERS:-5000} --warmup 500 --json > $W/$n-tcp4-$round.jsonl 2>/dev/null
  done
done
python3 - "$W" "$R" "$@" <<'PY' | tee ${OUT:-/tmp}/bisect.txt
import json,sys,glob,os,statistics
W,R=sys.argv[1],int(sys.argv[2]); bins=[os.path.basename(b) for b in sys.argv[3:]]
for case in ["shm2","tcp4"]:
    tab={}
    for b in bins:
        for r in range(1,R+1):
            try:
                for line in open(f"{W}/{b}-{case}-{r}.jsonl"):
                    try: j=json.loads(line)
                    except: continue
                    if "bytes" not in j: continue
                    t=j.get("time_us", j.get("time_s",0)*1e6 if "time_s" in j else None)
                    if t is None:
                        t=[v for k,v in j.items() if "time" in k][0]
                    tab.setdefault((j["bytes"],b),[]).append(t)
            except FileNotFoundError: pass
    sizes=sorted({k[0] for k in tab})
    print(f"## {case} (median of {R} rounds, µs)")
    print("| bytes | "+" | ".join(bins)+" |")
    for s in sizes:
        print(f"| {s} | "+" | ".join(f"{statistics.median(tab[(s,b)]):.3f}" if (s,b) in tab else "-" for b in bins)+" |")
PY
