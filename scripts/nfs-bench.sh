#!/usr/bin/env bash
# RDMA next to TCP for `softrdma nfs get/put` against `softrdma nfs serve` on loopback
# (issue 17, docs/performance.md). One command:
#
#   scripts/nfs-bench.sh [SIZE_MIB=1024] [ROUNDS=3]
#
# Starts a server on 127.0.0.1 (ports 30049 RDMA, 3049 TCP, 30048 MOUNT; SOFTRDMA_NFS_PORTS
# overrides as "rdma tcp mount"), writes a random file of SIZE_MIB into its export, then per
# round and operation (get to a new local file, get to /dev/null, put) both transports one
# after the other, the first of the two alternating by round; every copy's sha256 is checked
# against the original. Prints each figure, the medians, and RDMA/TCP per row
# (the goal: >= 1.2). Set SOFTRDMA to the binary (default: target/release/softrdma) and
# NFS_BENCH_DIR for the scratch directory (default: a new one under /tmp, removed at exit).
set -euo pipefail
size_mib=${1:-1024}
rounds=${2:-3}
here=$(cd "$(dirname "$0")/.." && pwd)
bin=${SOFTRDMA:-$here/target/release/softrdma}
read -r prdma ptcp pmnt <<<"${SOFTRDMA_NFS_PORTS:-30049 3049 30048}"
[ -x "$bin" ] || { echo "no $bin (cargo build --release -p softrdma)" >&2; exit 2; }
command -v jq >/dev/null || { echo "needs jq" >&2; exit 2; }
dir=${NFS_BENCH_DIR:-$(mktemp -d /tmp/nfs-bench.XXXXXX)}
mkdir -p "$dir/exp"
srv=
cleanup() {
    [ -n "$srv" ] && kill "$srv" 2>/dev/null && wait "$srv" 2>/dev/null
    [ -z "${NFS_BENCH_DIR:-}" ] && rm -rf "$dir"
    return 0
}
trap cleanup EXIT
"$bin" nfs serve "$dir/exp" --rdma "127.0.0.1:$prdma" --tcp "127.0.0.1:$ptcp" --mount-port "$pmnt" \
    --key-file "$dir/key" >"$dir/serve.log" 2>&1 &
srv=$!
for _ in $(seq 100); do grep -q "exporting" "$dir/serve.log" && break; sleep 0.1; done
grep -q "exporting" "$dir/serve.log" || { cat "$dir/serve.log" >&2; exit 1; }
head -c $((size_mib << 20)) /dev/urandom >"$dir/exp/src.bin"
want=$(sha256sum "$dir/exp/src.bin" | cut -d' ' -f1)
echo "load: $(cut -d' ' -f1-3 /proc/loadavg); ${size_mib} MiB, $rounds rounds, rsize/wsize 1M, 4 calls in flight, the same client and server code over either transport" >&2
declare -A fig last
# One operation at a time over both transports, and the order of the two turns each round
# (RDMA first in odd rounds, TCP first in even ones), so both see the same minutes of the
# machine: a loaded or warming machine otherwise favours whichever ran second.
for r in $(seq "$rounds"); do
    order="rdma tcp"; [ $((r % 2)) = 0 ] && order="tcp rdma"
    for op in get-file get-null put; do
        for t in $order; do
            p=$prdma; [ "$t" = tcp ] && p=$ptcp
            c=("$bin" nfs --transport "$t" --port "$p" --mount-port "$pmnt" --json)
            case $op in
            get-file)
                rm -f "$dir/out.bin"
                gj=$("${c[@]}" get 127.0.0.1:/src.bin "$dir/out.bin")
                v=$(jq -r .mb_per_s <<<"$gj")
                [ "$r" = 1 ] && echo "$t: $(jq -c '{rsize, wsize, calls_in_flight}' <<<"$gj")" >&2
                [ "$(sha256sum "$dir/out.bin" | cut -d' ' -f1)" = "$want" ] || { echo "get over $t: sha256 differs" >&2; exit 1; }
                rm -f "$dir/out.bin" ;;
            get-null)
                v=$("${c[@]}" get 127.0.0.1:/src.bin /dev/null | jq -r .mb_per_s) ;;
            put)
                v=$("${c[@]}" put "$dir/exp/src.bin" "127.0.0.1:/put-$t.bin" | jq -r .mb_per_s)
                [ "$(sha256sum "$dir/exp/put-$t.bin" | cut -d' ' -f1)" = "$want" ] || { echo "put over $t: sha256 differs" >&2; exit 1; }
                rm -f "$dir/exp/put-$t.bin" ;;
            esac
            fig[$t,$op]+="$v "; last[$t]=$v
        done
        printf 'round %s %-8s RDMA %8.1f  TCP %8.1f MB/s  RDMA/TCP %5.2f  (%s first)\n' "$r" "$op" \
            "${last[rdma]}" "${last[tcp]}" "$(echo "${last[rdma]} ${last[tcp]}" | awk '{print $1/$2}')" "${order%% *}"
    done
done
median() { tr ' ' '\n' | grep . | sort -g | awk '{v[NR]=$1} END {print (NR%2) ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2}'; }
printf '\n%-10s %10s %10s %10s\n' "median" "RDMA" "TCP" "RDMA/TCP"
for k in put get-file get-null; do
    a=$(echo "${fig[rdma,$k]}" | median); b=$(echo "${fig[tcp,$k]}" | median)
    printf '%-10s %10.1f %10.1f %10.2f\n' "$k" "$a" "$b" "$(echo "$a $b" | awk '{print $1/$2}')"
done
