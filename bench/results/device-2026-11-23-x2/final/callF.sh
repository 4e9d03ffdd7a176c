#!/bin/bash
# Call F (2 GPUs + host): ipc with the sweep's defaults (128 blocks, two-shot from 1 MiB) through
# ipc-check's tune and bench, and under CUDA-graph capture; shm reduce_scatter / all_to_all /
# scatter steps before/after at 2 and 8 ranks; host Faces and the staged trigger repeated.
. devbin/z2/common.sh
N=$Z/new/sucl; cp $N /work/main/target/release/sucl; uptime
step ipc-check
BIN_DIR=$Z/new OUT=$RES/ipcF FACTOR=2 ROUNDS=2 timeout 200 scripts/ipc-check.sh > $RES/ipcF-check.txt 2>&1; echo "rc=$?"
grep -E "^(PASS|FAIL)|ipc-check" $RES/ipcF-check.txt; cat $RES/ipcF/bench-all_reduce.txt $RES/ipcF/bench-all_reduce-ratios.txt
pack F
step ipc-graph
for r in 1 2; do timeout 60 $N bench all_reduce --device cuda --ranks 2 --graph --compare nccl,ipc --min-bytes 8 --max-bytes 4M --factor 2 --rounds 2 --iters 100 --warmup 20 > $RES/ipcF-graph-$r.txt 2>&1; echo "rc=$?"; done
cat $RES/ipcF-graph-1.txt $RES/ipcF-graph-2.txt | grep -E "^ +[0-9]|bytes"
pack F
step shm-steps
for n in 2 8; do for r in 1 2; do for op in reduce_scatter all_to_all scatter; do for v in b4 after; do
  b=$N; [ $v = b4 ] && b=$Z/b4/sucl
  timeout 15 $b bench $op --ranks $n --backend shm --min-bytes 65536 --max-bytes 16777216 --iters 50 --json > $RES/st-$op-$n-$v-$r.jsonl 2>/dev/null
done; done; done; done
python3 - $RES <<'PY' | tee $RES/shm-steps.md
import json,sys,glob,statistics,collections
R=sys.argv[1]; d=collections.defaultdict(list)
for f in glob.glob(f"{R}/st-*.jsonl"):
    _,op,n,v,r=f.rsplit('/',1)[1][:-6].split('-')
    for l in open(f):
        try: j=json.loads(l.split('] ',1)[-1])
        except Exception: continue
        if 'time_us' in j: d[(op,int(n),v,j['bytes'])].append(j['time_us'])
print("| op | ranks | bytes | before µs | after µs | after/before |\n|---|---:|---:|---:|---:|---:|")
for (op,n,v,b) in sorted(k for k in d if k[2]=='after'):
    a=statistics.median(d[(op,n,'after',b)]); o=statistics.median(d.get((op,n,'b4',b),[float('nan')]))
    print(f"| {op} | {n} | {b} | {o:.1f} | {a:.1f} | {a/o:.2f} |")
PY
pack F
step faces-host
for rep in 1 2; do for n in 2 4 8; do case $n in 2) g="2 1 1";; 4) g="2 2 1";; 8) g="2 2 2";; esac
  for sz in "4 4 4 4" "15 14 13 12"; do for v in b4 after; do f=$Z/faces; [ $v = b4 ] && f=$Z/b4/faces
    timeout 20 $N run -n $n -- $f $g $sz 1 2 20 2>&1 | grep -E "triggered / baseline" | sed "s/^/$v n=$n $sz rep $rep: /"; done; done; done; done | tee $RES/faces-host-ab.txt
pack F
step staged-trigger
for rep in 1 2; do timeout 60 $N run -n 2 -- $Z/st_gpu bench staged 2>&1 | grep -E "trigger round trip"; done | tee $RES/staged-trigger.txt
pack F
step done
