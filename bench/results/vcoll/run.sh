#!/usr/bin/env bash
# Host v-collectives against their plain forms, before and after, side by side on shm.
#
#   BEFORE=/path/to/old/sucl AFTER=/path/to/new/sucl bench/results/vcoll/run.sh
#
# For every rank count in RANKS (default "4 8") and every op pair (gather/gatherv,
# all_gather/all_gatherv, scatter/scatterv, all_to_all/all_to_allv) it runs `sucl bench` once
# per binary for 8 B, 64 KiB .. 1 MiB and 4 MiB .. 64 MiB (factor 4), the two binaries
# alternating (ABBA over the ops, so neither always runs first). Prints one markdown table:
# time (µs, nccl-tests' definition: mean over the timed iterations, max over ranks) of the
# plain and the v form, before and after, and the ratio v / plain after. Rows carry `#wrong`
# from the bench's own check (first and last timed call against the serial reference).
#
# Sized for a 16-core machine in under 60 s (96 bench jobs; each is bounded by `timeout`).
# Environment: BEFORE, AFTER (required); RANKS, OPS (plain op names); timed iterations
# ITERS_SMALL (8 B, default 300), ITERS_MID (64 KiB .. 1 MiB, 50), ITERS_LARGE (4 MiB .. 64 MiB,
# 5); OUT (a directory for the raw JSON lines, default a temporary one); JOB_TIMEOUT (seconds
# per job, default 30).
set -euo pipefail

: "${BEFORE:?set BEFORE to the old sucl binary}"
: "${AFTER:?set AFTER to the new sucl binary}"
RANKS=${RANKS:-"4 8"}
OPS=${OPS:-"all_to_all all_gather gather scatter"}
ITERS_LARGE=${ITERS_LARGE:-5}
ITERS_SMALL=${ITERS_SMALL:-300}
ITERS_MID=${ITERS_MID:-50}
JOB_TIMEOUT=${JOB_TIMEOUT:-30}
OUT=${OUT:-$(mktemp -d)}
export NCCL_NVLS_ENABLE=0 # never create an NVLink multicast object (device-machine rule)
mkdir -p "$OUT"
raw="$OUT/rows.tsv"
: >"$raw"
start=$SECONDS

# One bench job: appends "ranks variant op bytes time_us wrong" lines to $raw.
job() {
    local variant=$1 bin=$2 n=$3 op=$4
    shift 4
    local log="$OUT/$variant-$n-$op-$RANDOM.jsonl"
    if ! timeout "$JOB_TIMEOUT" "$bin" bench "$op" --ranks "$n" --backend shm --json "$@" >"$log" 2>"$log.err"; then
        echo "FAILED: $variant $op x$n $* (see $log.err)" >&2
        return 0
    fi
    sed -n 's/.*"op":"\([a-z_]*\)".*"bytes":\([0-9]*\).*"time_us":\([0-9.e+-]*\).*"wrong":\([0-9a-z]*\).*/\1 \2 \3 \4/p' "$log" |
        while read -r o b t w; do echo "$n $variant $o $b $t $w"; done >>"$raw"
}

k=0
for n in $RANKS; do
    for op in $OPS; do
        for form in "$op" "${op}v"; do
            if ((k % 2 == 0)); then order="before after"; else order="after before"; fi
            k=$((k + 1))
            for variant in $order; do
                bin=$BEFORE
                [ "$variant" = after ] && bin=$AFTER
                job "$variant" "$bin" "$n" "$form" --min-bytes 8 --max-bytes 8 --iters "$ITERS_SMALL" --warmup 20
                job "$variant" "$bin" "$n" "$form" --min-bytes 64K --max-bytes 1M --factor 4 --iters "$ITERS_MID" --warmup 3
                job "$variant" "$bin" "$n" "$form" --min-bytes 4M --max-bytes 64M --factor 4 --iters "$ITERS_LARGE" --warmup 1
            done
        done
    done
done

echo "# v-collectives vs plain on shm ($(hostname), $(nproc) CPUs), $((SECONDS - start)) s"
echo
echo "| ranks | op | bytes | plain before | plain after | v before | v after | v/plain after | #wrong |"
echo "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
# Plain awk (mawk on Ubuntu): one line per (ranks, op, bytes), sorted, then formatted.
awk 'function v(x) { return x == "" ? "-" : x }
    { key = $1 " " $3 " " $4; t[$2 " " key] = $5; w[key] += ($6 == "null" ? 0 : $6)
      base = $3; sub(/v$/, "", base); if (base != $3) { vkey[$1 " " base " " $4] = key } }
    END {
        for (pk in vkey) {
            vk = vkey[pk]; split(pk, p, " ")
            pa = t["after " pk]; va = t["after " vk]
            ratio = (pa > 0 && va > 0) ? sprintf("%.2f", va / pa) : "-"
            printf "%s %s %s %s %s %s %s %s %d\n", p[1], p[2], p[3], v(t["before " pk]), v(pa), v(t["before " vk]), v(va), ratio, w[pk] + w[vk]
        }
    }' "$raw" | sort -k1,1n -k2,2 -k3,3n |
    awk 'function us(x) { return x == "-" ? "-" : sprintf("%.2f", x) }
         { printf "| %s | %s/%sv | %s | %s | %s | %s | %s | %s | %s |\n", $1, $2, $2, $3, us($4), us($5), us($6), us($7), $8, $9 }'
echo
echo "raw rows: $raw"
