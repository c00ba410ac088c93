#!/usr/bin/env bash
# Where `softrdma nfs get/put`'s time goes, per thread role, client and server, for each
# operation and transport (issues 17/18, docs/performance.md "Session 15: NFS get/put").
# Starts `nfs serve` on loopback, writes a random file of SIZE_MIB into its export, then per
# operation (get to /dev/null, get to a new file, put) and transport (in the order given)
# runs the client alone and prints, per MiB moved, each role's CPU time, its time runnable
# but waiting for a CPU (run-queue delay) and its timeslices (about one per wake-up), from
# /proc/PID/task/*/schedstat: the client's sampled every 20 ms until it exits (the last
# sample of each thread counts: a thread that ends between samples loses at most 20 ms),
# the server's as the difference before and after.
#
#   scripts/nfs-schedstat.sh [BINARY=target/release/softrdma] [SIZE_MIB=256] [ORDER="rdma tcp"]
#
# Ports: SOFTRDMA_NFS_PORTS="rdma tcp mount" (default "30049 3049 30048").
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
bin=${1:-$here/target/release/softrdma}
size=${2:-256}
order=${3:-rdma tcp}
read -r prdma ptcp pmnt <<<"${SOFTRDMA_NFS_PORTS:-30049 3049 30048}"
command -v jq >/dev/null || { echo "needs jq" >&2; exit 2; }
d=$(mktemp -d /tmp/nfs-schedstat.XXXXXX)
mkdir -p "$d/exp"
"$bin" nfs serve "$d/exp" --rdma "127.0.0.1:$prdma" --tcp "127.0.0.1:$ptcp" --mount-port "$pmnt" \
    --key-file "$d/key" >"$d/serve.log" 2>&1 &
srv=$!
trap 'kill $srv 2>/dev/null; wait $srv 2>/dev/null; rm -rf "$d"' EXIT
for _ in $(seq 100); do grep -q exporting "$d/serve.log" && break; sleep 0.1; done
grep -q exporting "$d/serve.log" || { cat "$d/serve.log" >&2; exit 1; }
head -c $((size << 20)) /dev/urandom >"$d/exp/src.bin"
# bash builtins only: a fork per thread would make the sampling slower than the run
snap() {
    local t s cm
    for t in /proc/$1/task/*; do
        { read -r s <"$t/schedstat" && read -r cm <"$t/comm"; } 2>/dev/null || continue
        echo "${t##*/} ${cm// /_} $s"
    done
}
# per role (thread name without its digits), per MiB: CPU ms, run-queue wait ms, timeslices
summ() {
    awk '{last[$1] = $0} END {for (t in last) print last[t]}' |
        awk -v mib="$size" -v who="$1" '{n=$2; gsub(/[-0-9]+$/, "", n); cpu[n]+=$3/1e6; w[n]+=$4/1e6; sl[n]+=$5; T+=$3/1e6; W+=$4/1e6; S+=$5}
            END {for (n in cpu) if (cpu[n]/mib >= 0.02) printf "  %s %-18s cpu %5.2f ms  runq-wait %5.2f ms  timeslices %5.1f  per MiB\n", who, n, cpu[n]/mib, w[n]/mib, sl[n]/mib;
                 printf "  %s %-18s cpu %5.2f ms  runq-wait %5.2f ms  timeslices %5.1f  per MiB\n", who, "(all threads)", T/mib, W/mib, S/mib}' |
        sort -k5 -nr
}
for op in get-null get-file put; do
    for tr in $order; do
        p=$prdma; [ "$tr" = tcp ] && p=$ptcp
        c=("$bin" nfs --transport "$tr" --port "$p" --mount-port "$pmnt" --json)
        case $op in
        get-null) args=(get 127.0.0.1:/src.bin /dev/null) ;;
        get-file) args=(get 127.0.0.1:/src.bin "$d/out.bin") ;;
        put) args=(put "$d/exp/src.bin" "127.0.0.1:/put.bin") ;;
        esac
        load=$(cut -d' ' -f1 /proc/loadavg)
        snap $srv >"$d/s0"
        : >"$d/cl"
        "${c[@]}" "${args[@]}" >"$d/j" &
        cp=$!
        while kill -0 $cp 2>/dev/null; do snap $cp >>"$d/cl"; sleep 0.02; done
        wait $cp
        snap $srv >"$d/s1"
        echo "== $op over $tr: $(jq -r '.mb_per_s | floor' "$d/j") MB/s, $size MiB, load $load"
        summ client <"$d/cl"
        # the server's threads: what this run added
        awk 'NR==FNR {a[$1]=$3" "$4" "$5; next} {split(a[$1],x," "); print $1, $2, $3-x[1], $4-x[2], $5-x[3]}' \
            "$d/s0" "$d/s1" | summ server
        rm -f "$d/out.bin" "$d/exp/put.bin"
    done
done
