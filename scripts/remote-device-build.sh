#!/usr/bin/env bash
# Builds here (no GPU needed) what scripts/remote-device-run.sh runs on the device machine and
# puts stripped binaries in DEST/bin and the scripts in DEST, with DEST/run.sh, which writes
# OUT/remote2/{log.txt,remote-scale.csv}.
# usage: DEST=dir scripts/remote-device-build.sh      (then, there: bash DEST/run.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=${DEST:?a directory}
cargo build --release -p sucl-remote --bin sucld --example remote_bench --example remote_cuda_check
cargo build --release -p sucl --example jacobi3d_sendrecv
cargo build --release -p sucl-cli --bin sucl
mkdir -p "$DEST/bin"
for b in sucld examples/remote_bench examples/remote_cuda_check sucl examples/jacobi3d_sendrecv; do
  strip -o "$DEST/bin/$(basename "$b")" "target/release/$b"
done
cp scripts/remote-device-run.sh scripts/remote-scale.sh bench/remote-host-netns.sh "$DEST/"
cat >"$DEST/run.sh" <<'RUN'
#!/usr/bin/env bash
# The remote figures on the device machine: results in $OUT/remote2 (log.txt, remote-scale.csv).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
D=$(cd "$(dirname "$0")" && pwd)
BIN=$D/bin SCRIPTS=$D RESULTS=${OUT:?}/remote2 timeout -k 5 118 bash "$D/remote-device-run.sh"
echo "remote2: exit $?"
tail -n 150 "$OUT/remote2/log.txt"; cat "$OUT/remote2/remote-scale.csv" 2>/dev/null
RUN
chmod +x "$DEST/run.sh"
du -sh "$DEST"
