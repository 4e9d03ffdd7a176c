# Sourced by the call scripts: paths, result folder, a tar of results after every step.
export NCCL_NVLS_ENABLE=0
Z=devbin/z2; RES=/tmp/res2; mkdir -p $RES
mkdir -p /work/main/target/release && cp $Z/sucl /work/main/target/release/sucl
T0=$(date +%s)
step() { echo "== $1 ($(( $(date +%s) - T0 )) s)"; }
pack() { tar czf $OUT/$1.tgz -C $RES . 2>/dev/null; }
