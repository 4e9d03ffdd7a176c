#!/bin/bash
# Call E (host side of the 32-core machine, plus the stream-triggered GPU script): before (b4 = d4ee521,
# this session's start) vs after, side by side.
. devbin/z2/common.sh
B=$Z/b4; uptime
step gpu-stream
BIN=$Z/sucl ST=$Z/st_gpu FACES=$Z/faces PLOT=$Z/stream_plot ST_TEST=$Z/stream_gpu_tests OUT=$RES/stream \
  timeout 180 scripts/gpu-stream.sh > $RES/gpu-stream.txt 2>&1; echo "rc=$?"
grep -E "bench (nccl|staged)|triggered / baseline|gpu-stream:" $RES/gpu-stream.txt | head -40
pack E
step faces-host-before
for n in 2 4 8; do case $n in 2) g="2 1 1";; 4) g="2 2 1";; 8) g="2 2 2";; esac
  for sz in "4 4 4 4" "15 14 13 12"; do timeout 20 $Z/sucl run -n $n -- $B/faces $g $sz 1 2 20 2>&1 | grep -E "triggered / baseline|host time" | sed "s/^/before n=$n $sz: /"; done; done > $RES/faces-host-before.txt
cat $RES/faces-host-before.txt
pack E
step hier
ROUNDS=4 ITERS=100 W=/tmp/hier PROFILE=1 timeout 120 scripts/bench-hier.sh $B/sucl $Z/sucl > $RES/hier-2x2.md 2> $RES/hier-2x2.err; echo "rc=$?"
grep -E "^\| [0-9]" $RES/hier-2x2.md | awk -F'|' '{print $2,$4,$5,$6,$7}'
pack E
step tcp-2r
BACKENDS=tcp R=2 ROUNDS=3 ITERS=200 MAXB=16777216 BEFORE=$B/sucl AFTER=$Z/sucl timeout 70 scripts/bench-before-after.sh > $RES/tcp-2r.md 2>&1; echo "rc=$?"
grep -E "^\| [0-9]" $RES/tcp-2r.md | head -30
pack E
step shm-moves
for n in 2 8; do for r in 1 2; do for op in all_gather reduce_scatter; do for v in b4 after; do
  b=$Z/sucl; [ $v = b4 ] && b=$B/sucl
  timeout 15 $b bench $op --ranks $n --backend shm --min-bytes 65536 --max-bytes 16777216 --iters 50 --json > $RES/mv-$op-$n-$v-$r.jsonl 2>/dev/null
done; done; done; done
python3 - $RES <<'PY' | tee $RES/shm-moves.md
import json,sys,glob,statistics,collections
R=sys.argv[1]; d=collections.defaultdict(list)
for f in glob.glob(f"{R}/mv-*.jsonl"):
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
pack E
step shm-small-16r
BACKENDS=shm R=16 ROUNDS=3 ITERS=3000 MAXB=4096 BEFORE=$Z/sucl-d651309 AFTER=$Z/sucl timeout 60 scripts/bench-before-after.sh > $RES/shm-16r-small.md 2>&1; echo "rc=$?"
grep -E "^\| [0-9]" $RES/shm-16r-small.md
pack E
step reconnect
BEFORE=$B/remote_bench AFTER=$Z/remote_bench ROUNDS=3 N=300 OUT=$RES/reconnect timeout 60 bench/results/remote/reconnect/before_after.sh > $RES/reconnect.md 2>&1; echo "rc=$?"
grep -E "^\| (TLS|plain)" $RES/reconnect.md
pack E
step done
