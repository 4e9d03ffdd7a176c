#!/usr/bin/env bash
# OpenCL latency (an empty kernel + clFinish) and 64 MiB clEnqueueWriteBuffer/ReadBuffer
# bandwidth, back to back in one run, for every path to the same PoCL CPU device:
#   raw TCP        the round trip of a command-sized message, and a one-way stream (tcpbase.c)
#   PoCL direct    the device used in-process (loopback table only: no network involved);
#                  with SERVED_ICD another vendor's device (NVIDIA's OpenCL on a GPU host)
#   PoCL-R         PoCL's remote client driver → pocld (the anchor; built by build-pocl-r.sh)
#   sucl TLS on    the ICD libsucl_opencl.so → sucld --opencl, TLS and a token
#   sucl TLS off   the same with sucld --no-tls and SUCL_REMOTE_TLS=off
# printed as one table: latency beside "µs over the raw round trip", bandwidth beside "% of the
# raw TCP stream". --veth measures the networked paths again with the daemons in one network
# namespace and the clients in another, joined by a veth pair.
#
# How to reproduce (Debian 12; root for --veth):
#   apt-get install ocl-icd-opencl-dev opencl-c-headers pocl-opencl-icd cmake g++
#   git -C pocl archive v7.0 | tar -x -C /tmp/pocl-7.0      # a pocl/pocl checkout
#   bench/opencl/build-pocl-r.sh --prefix /work/pocl-r /tmp/pocl-7.0
#   cargo build --release -p sucl-remote --bin sucld && cargo build --release -p sucl-opencl
#   POCL_R_PREFIX=/work/pocl-r REPS=7 bench/opencl/latency-bandwidth.sh --veth
# Each latency figure is the median over REPS client runs of each run's median of ITERS
# kernels (the spread of the run medians is printed beside it); each bandwidth figure is the
# median of REPS transfers. Numbers on a shared machine are noisy: run REPS >= 5 and say so.
set -euo pipefail

usage() {
    cat <<'EOF'
usage: bench/opencl/latency-bandwidth.sh [--veth] [--no-loopback]

Measures OpenCL latency (empty kernel + clFinish) and MIB MiB write/read bandwidth through
raw TCP, PoCL directly, PoCL-R, sucl with TLS and sucl without TLS, and prints one table.

  --veth          also measure across a veth pair between two network namespaces (root)
  --no-loopback   skip the loopback table (with --veth: only the veth table)
  -h, --help      this text

Environment:
  ITERS=5000      kernels per latency run            REPS=7   runs / transfers per figure
  MIB=64          transfer size in MiB               TIMEOUT=300  seconds any one client may take
  SUCLD, SUCL_ICD sucld and libsucl_opencl.so (default target/release/, built when absent)
  POCL_R_PREFIX   a PoCL-R build (bench/opencl/build-pocl-r.sh): PREFIX/bin/pocld and
                  PREFIX/lib/libpocl.so; without it the PoCL-R rows are skipped
  SERVED_ICD      the one OpenCL vendor (.icd file or library) that sucld serves and the
                  direct row uses, e.g. /etc/OpenCL/vendors/nvidia.icd (default: every platform)
  DIRECT_PLATFORM a substring of that platform's name for the direct row (default Portable)
  CLBENCH, TCPBASE  prebuilt clbench.c and tcpbase.c (default: compiled here with cc)
EOF
}

veth=0; loopback=1
while [ $# -gt 0 ]; do
    case "$1" in
        -h|--help) usage; exit 0 ;;
        --veth) veth=1; shift ;;
        --no-loopback) loopback=0; shift ;;
        *) echo "latency-bandwidth.sh: unknown argument $1" >&2; usage >&2; exit 2 ;;
    esac
done
cd "$(dirname "$0")/../.."
ITERS=${ITERS:-5000}; MIB=${MIB:-64}; REPS=${REPS:-7}; TIMEOUT=${TIMEOUT:-300}
for v in ITERS MIB REPS TIMEOUT; do
    [[ ${!v} =~ ^[1-9][0-9]*$ ]] || { echo "latency-bandwidth.sh: $v must be a positive integer" >&2; exit 2; }
done
if [ "$veth" = 1 ] && [ "$(id -u)" != 0 ]; then
    echo "latency-bandwidth.sh: --veth needs root (ip netns, ip link)" >&2; exit 2
fi

missing=()
for tool in timeout mkfifo; do command -v "$tool" >/dev/null || missing+=("$tool"); done
[ "$veth" = 0 ] || command -v ip >/dev/null || missing+=(ip)
[ -z "${POCL_R_PREFIX:-}" ] || command -v ss >/dev/null || missing+=(ss)
if [ -z "${CLBENCH:-}" ] || [ -z "${TCPBASE:-}" ]; then
    command -v cc >/dev/null || missing+=(cc)
    [ -e /usr/include/CL/cl.h ] || missing+=("CL/cl.h (opencl-c-headers)")
fi
if [ ${#missing[@]} -gt 0 ]; then
    echo "latency-bandwidth.sh: missing ${missing[*]} (Debian: gcc coreutils iproute2 opencl-c-headers ocl-icd-opencl-dev)" >&2
    exit 2
fi
SUCLD=${SUCLD:-$PWD/target/release/sucld}
SUCL_ICD=${SUCL_ICD:-$PWD/target/release/libsucl_opencl.so}
[ -x "$SUCLD" ] || cargo build --release -q -p sucl-remote --bin sucld
[ -f "$SUCL_ICD" ] || cargo build --release -q -p sucl-opencl
SUCLD=$(realpath "$SUCLD"); SUCL_ICD=$(realpath "$SUCL_ICD")
DIRECT_PLATFORM=${DIRECT_PLATFORM:-Portable}
# What the daemon and the direct client see: one vendor (both loaders' variables), or all.
if [ -n "${SERVED_ICD:-}" ] && [ ! -e "$SERVED_ICD" ]; then
    echo "latency-bandwidth.sh: no SERVED_ICD $SERVED_ICD" >&2; exit 2
fi
# shellcheck source=scripts/lib/opencl-vendor.sh
source scripts/lib/opencl-vendor.sh
served_env_for "${SERVED_ICD:-}"
pocl_r=
if [ -n "${POCL_R_PREFIX:-}" ] && [ -x "$POCL_R_PREFIX/bin/pocld" ] && [ -f "$POCL_R_PREFIX/lib/libpocl.so" ]; then
    pocl_r=$(realpath "$POCL_R_PREFIX")
fi

work=$(mktemp -d)
daemon=
netns_srv=; netns_cli=
stdin_fd=
# shellcheck disable=SC2317  # called by the EXIT trap
cleanup() {
    stop_daemon
    [ -n "$stdin_fd" ] && exec {stdin_fd}>&-
    [ -n "$netns_cli" ] && ip netns del "$netns_cli" 2>/dev/null
    [ -n "$netns_srv" ] && ip netns del "$netns_srv" 2>/dev/null
    rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

stop_daemon() {
    if [ -n "$daemon" ]; then
        kill "$daemon" 2>/dev/null || true
        for _ in $(seq 50); do kill -0 "$daemon" 2>/dev/null || break; sleep 0.1; done
        kill -9 "$daemon" 2>/dev/null || true
        wait "$daemon" 2>/dev/null || true
        daemon=
    fi
}

if [ -n "${CLBENCH:-}" ]; then cp "$CLBENCH" "$work/clbench"; else cc -O2 -o "$work/clbench" bench/opencl/clbench.c -lOpenCL; fi
if [ -n "${TCPBASE:-}" ]; then cp "$TCPBASE" "$work/tcpbase"; else cc -O2 -o "$work/tcpbase" bench/opencl/tcpbase.c; fi
"$SUCLD" --gen-token "$work/token" >/dev/null
# PoCL-R's client (7.0) can hang once its standard input becomes readable: every client gets
# a FIFO that this script holds open for writing and never writes to, so it never is.
mkfifo "$work/stdin"
exec {stdin_fd}<>"$work/stdin"

# The current location: commands for the server side and the client side, and the address.
srv=(); cli=(); addr=127.0.0.1

median() { sort -g | awk '{v[NR]=$1} END {if (NR) print v[int((NR+1)/2)]}'; }
spread() { sort -g | awk 'NR==1{lo=$1} {hi=$1} END {if (NR) printf "%s-%s", lo, hi}'; }

# client LABEL ENV... -- CMD...: runs one client in the client namespace, bounded by TIMEOUT.
client() {
    local label=$1; shift
    local envs=()
    while [ "$1" != -- ]; do envs+=("$1"); shift; done
    shift
    if ! "${cli[@]}" env "${envs[@]}" timeout -k 5 "$TIMEOUT" "$@" <"$work/stdin" 2>"$work/err"; then
        echo "# $label failed: $(tail -n 3 "$work/err" | tr '\n' ' ')" >&2
        return 1
    fi
}

declare -A lat lat_spread wr rd beside
pocld_port=; sucl_env=(); platform=
# tcp_stream: the raw TCP stream (GB/s, median of REPS) between the current two ends.
tcp_stream() {
    local out ns=()
    [ -n "$netns_srv" ] && ns=(--addr "$addr" --server-netns "$netns_srv" --client-netns "$netns_cli")
    out=$(timeout -k 5 "$TIMEOUT" "$work/tcpbase" "${ns[@]}" stream "$MIB" "$REPS") || { echo "# raw TCP stream failed" >&2; return 1; }
    sed -n 's/.* \([0-9.]*\) GB\/s.*/\1/p' <<<"$out"
}

# measure LABEL ENV... : REPS latency runs and one bandwidth run of clbench (platform from
# $platform), the bandwidth run right after a raw TCP stream on the same ends (the machine is
# shared: its load drifts, so each row's percentage is taken against the stream beside it);
# fills lat/wr/rd/beside[LABEL], or leaves them "failed".
measure() {
    local label=$1; shift
    local runs=() out
    lat[$label]=failed; lat_spread[$label]=; wr[$label]=failed; rd[$label]=failed; beside[$label]=failed
    for _ in $(seq "$REPS"); do
        out=$(client "$label" "$@" -- "$work/clbench" "$platform" latency "$ITERS") || return 0
        runs+=("$(sed -n 's/.*median \([0-9.]*\) us.*/\1/p' <<<"$out")")
    done
    lat[$label]=$(printf '%s\n' "${runs[@]}" | median)
    lat_spread[$label]=$(printf '%s\n' "${runs[@]}" | spread)
    beside[$label]=$(tcp_stream) || beside[$label]=failed
    out=$(client "$label" "$@" -- "$work/clbench" "$platform" bandwidth "$MIB" "$REPS") || return 0
    wr[$label]=$(sed -n 's/.*write \([0-9.]*\) GB.*/\1/p' <<<"$out")
    rd[$label]=$(sed -n 's/.*read \([0-9.]*\) GB.*/\1/p' <<<"$out")
}

measure_tcp() {
    local runs=() out ns=()
    [ -n "$netns_srv" ] && ns=(--addr "$addr" --server-netns "$netns_srv" --client-netns "$netns_cli")
    lat[tcp]=failed; wr[tcp]=failed; rd[tcp]=failed; beside[tcp]=failed
    for _ in $(seq "$REPS"); do
        out=$(timeout -k 5 "$TIMEOUT" "$work/tcpbase" "${ns[@]}" rtt "$ITERS") || { echo "# raw TCP round trip failed" >&2; return 0; }
        runs+=("$(sed -n 's/.*median \([0-9.]*\) us.*/\1/p' <<<"$out")")
    done
    lat[tcp]=$(printf '%s\n' "${runs[@]}" | median)
    lat_spread[tcp]=$(printf '%s\n' "${runs[@]}" | spread)
    wr[tcp]=$(tcp_stream) || { wr[tcp]=failed; return 0; }
    rd[tcp]=${wr[tcp]}; beside[tcp]=${wr[tcp]}
}

# A port base below the ephemeral range with PORT..PORT+2 free on the server side.
free_port() {
    local p
    for _ in $(seq 50); do
        p=$((20000 + RANDOM % 10000))
        "${srv[@]}" ss -Hltn "( sport = :$p or sport = :$((p + 1)) or sport = :$((p + 2)) )" | grep -q . || { echo "$p"; return; }
    done
    echo "latency-bandwidth.sh: no free port" >&2; return 1
}

# start_pocld: starts pocld on a free port base (it listens on PORT..PORT+2); sets pocld_port.
start_pocld() {
    pocld_port=$(free_port) || return 1
    "${srv[@]}" env -u OCL_ICD_VENDORS -u POCL_DEVICES "$pocl_r/bin/pocld" -a "$addr" -p "$pocld_port" \
        </dev/null >"$work/pocld.log" 2>&1 &
    daemon=$!
    for _ in $(seq 100); do
        "${srv[@]}" ss -Hltn "( sport = :$pocld_port )" | grep -q . && return 0
        kill -0 "$daemon" 2>/dev/null || break
        sleep 0.1
    done
    echo "# pocld did not start: $(tail -n 3 "$work/pocld.log" | tr '\n' ' ')" >&2
    stop_daemon
    return 1
}

# start_sucld on|off: starts sucld serving the OpenCL devices; sets sucl_env, the client's
# environment (VAR=value words).
start_sucld() {
    local tls=$1 flags
    if [ "$tls" = on ]; then flags=(--tls-ephemeral); else flags=(--no-tls); fi
    "${srv[@]}" env "${served_env[@]}" "$SUCLD" --token-file "$work/token" --listen "$addr:0" --opencl \
        --host-devices 0 "${flags[@]}" --print-address >"$work/sucld.out" 2>"$work/sucld.log" </dev/null &
    daemon=$!
    for _ in $(seq 300); do
        grep -q '^tls ' "$work/sucld.out" 2>/dev/null && break
        kill -0 "$daemon" 2>/dev/null || break
        sleep 0.1
    done
    if ! grep -q '^tls ' "$work/sucld.out" 2>/dev/null; then
        echo "# sucld did not start: $(tail -n 3 "$work/sucld.log" | tr '\n' ' ')" >&2
        stop_daemon
        return 1
    fi
    sucl_env=("SUCL_REMOTE=$(sed -n 's/^listening on //p' "$work/sucld.out")" "SUCL_REMOTE_TOKEN_FILE=$work/token")
    if [ "$tls" = on ]; then sucl_env+=("SUCL_REMOTE_TLS_PIN=$(sed -n 's/^tls pin //p' "$work/sucld.out")")
    else sucl_env+=(SUCL_REMOTE_TLS=off); fi
}

measure_sucl() {
    local tls=$1 label="sucl TLS $1"
    lat[$label]=failed; wr[$label]=failed; rd[$label]=failed; beside[$label]=failed
    start_sucld "$tls" || return 0
    platform=sucl measure "$label" OCL_ICD_VENDORS="$SUCL_ICD" OCL_ICD_FILENAMES="$SUCL_ICD" "${sucl_env[@]}"
    stop_daemon
}

measure_pocl_r() {
    local label=PoCL-R
    if [ -z "$pocl_r" ]; then
        echo "# PoCL-R skipped: POCL_R_PREFIX is unset or lacks bin/pocld and lib/libpocl.so (build it with bench/opencl/build-pocl-r.sh)"
        return 0
    fi
    lat[$label]=failed; wr[$label]=failed; rd[$label]=failed; beside[$label]=failed
    start_pocld || return 0
    platform=Portable measure "$label" OCL_ICD_VENDORS="$pocl_r/lib/libpocl.so" POCL_DEVICES=remote \
        POCL_REMOTE0_PARAMETERS="$addr:$pocld_port/0"
    stop_daemon
}

row() {
    local label=$1 name=$2 over pw pr
    [ -n "${lat[$label]+x}" ] || return 0
    over=-; pw=-; pr=-
    if [ "${lat[$label]}" != failed ] && [ "${lat[tcp]}" != failed ]; then
        over=$(awk -v a="${lat[$label]}" -v b="${lat[tcp]}" 'BEGIN {printf "%+.1f", a - b}')
    fi
    if [ "${wr[$label]}" != failed ] && [ "${beside[$label]}" != failed ]; then
        pw=$(awk -v a="${wr[$label]}" -v b="${beside[$label]}" 'BEGIN {printf "%.0f %%", 100 * a / b}')
        pr=$(awk -v a="${rd[$label]}" -v b="${beside[$label]}" 'BEGIN {printf "%.0f %%", 100 * a / b}')
    fi
    [ "$label" = tcp ] && over="(round trip)"
    printf '| %-12s | %10s | %-14s | %15s | %10s | %9s | %15s | %17s | %16s |\n' "$name" "${lat[$label]}" \
        "${lat_spread[$label]:-}" "$over" "${wr[$label]}" "${rd[$label]}" "${beside[$label]}" "$pw" "$pr"
}

table() {
    local where=$1
    echo
    echo "# $where — $(date -u '+%F %T UTC'), $(nproc)-core $(uname -m), load average$(uptime | sed 's/.*load average//')"
    echo "# ITERS=$ITERS kernels per latency run, REPS=$REPS runs/transfers per figure, MIB=$MIB"
    echo "| path         | latency µs | run medians µs | over raw RTT µs | write GB/s | read GB/s | raw stream GB/s | write % of stream | read % of stream |"
    echo "|--------------|-----------:|----------------|----------------:|-----------:|----------:|----------------:|------------------:|-----------------:|"
    row tcp "raw TCP"
    if [ "$DIRECT_PLATFORM" = Portable ]; then row direct "PoCL direct"; else row direct "$DIRECT_PLATFORM direct"; fi
    row PoCL-R "PoCL-R"
    row "sucl TLS on" "sucl TLS on"
    row "sucl TLS off" "sucl TLS off"
    echo "# latency: median of $REPS runs' medians of $ITERS kernels; write/read: median of $REPS transfers of $MIB MiB, GB/s = 10^9 B/s;"
    echo "# raw stream: the raw TCP stream (median of $REPS) measured just before that row's transfers, which its percentages divide by"
}

any_failed() {
    local k
    for k in "${!lat[@]}"; do [ "${lat[$k]}" != failed ] && [ "${wr[$k]}" != failed ] || return 0; done
    return 1
}

measure_all() {
    lat=(); lat_spread=(); wr=(); rd=(); beside=()
    measure_tcp
    [ -z "$netns_srv" ] && platform=$DIRECT_PLATFORM measure direct -u POCL_DEVICES "${served_env[@]}"
    measure_pocl_r
    measure_sucl on
    measure_sucl off
}

setup_veth() {
    local id=$$
    netns_srv=suclbench-srv-$id; netns_cli=suclbench-cli-$id
    ip netns add "$netns_srv"
    ip netns add "$netns_cli"
    ip link add "sb-s$id" type veth peer name "sb-c$id"
    ip link set "sb-s$id" netns "$netns_srv"
    ip link set "sb-c$id" netns "$netns_cli"
    ip -n "$netns_srv" addr add 10.231.77.1/24 dev "sb-s$id"
    ip -n "$netns_cli" addr add 10.231.77.2/24 dev "sb-c$id"
    for ns in "$netns_srv" "$netns_cli"; do ip -n "$ns" link set lo up; done
    ip -n "$netns_srv" link set "sb-s$id" up
    ip -n "$netns_cli" link set "sb-c$id" up
    srv=(ip netns exec "$netns_srv"); cli=(ip netns exec "$netns_cli"); addr=10.231.77.1
}

echo "# sucld: $SUCLD ($("$SUCLD" --version)); ICD: $SUCL_ICD"
if [ -n "$pocl_r" ]; then echo "# PoCL-R: $(cat "$pocl_r/VERSION" 2>/dev/null || echo "$pocl_r")"; fi
echo "# served platform: $(env -u POCL_DEVICES "${served_env[@]}" clinfo --raw 2>/dev/null | sed -n 's/.*CL_PLATFORM_VERSION *//p' | head -n 1)"
status=0
if [ "$loopback" = 1 ]; then
    measure_all
    table "loopback (127.0.0.1)"
    any_failed && status=1
fi
if [ "$veth" = 1 ]; then
    setup_veth
    measure_all
    table "veth pair between network namespaces ($addr, daemons and clients in separate namespaces)"
    any_failed && status=1
fi
exit $status
