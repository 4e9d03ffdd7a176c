#!/bin/bash
# before/after of the library's small all_reduce path, same program (micro.rs) built at both commits
R=${1:-9}
for r in $(seq 1 $R); do
  for v in d651309 3ecef04; do
    l=devbin/bis/s0-d651309; [ $v = 3ecef04 ] && l=devbin/bis/s5-3ecef04
    SUCL_BACKEND=shm ITERS=200000 timeout 120 $l run --ranks 2 -- devbin/bis/micro-$v 2>/dev/null | sed "s/^\[[0-9]*\] //; s/^/$v /" >> /tmp/micro.txt
  done
done
python3 - <<'PY'
import statistics as st
d={}
for l in open('/tmp/micro.txt'):
    v,b,t=l.split(); d.setdefault((int(b),v),[]).append(float(t))
print("| bytes | d651309 µs | 3ecef04 µs | ratio |")
for b in sorted({k[0] for k in d}):
    x,y=st.median(d[(b,'d651309')]),st.median(d[(b,'3ecef04')])
    print(f"| {b} | {x:.3f} | {y:.3f} | {y/x:.2f} |")
PY
