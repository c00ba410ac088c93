#!/usr/bin/env bash
# Per-thread CPU of `softrdma rpc bench --size 1M --transport rdma` over 2 s (issue 18: which
# thread limits the 1 MiB calls with several callers; docs/performance.md, Session 13 round 2).
#
#   scripts/rpc-threads.sh [BINARY=target/release/softrdma] [THREADS=4]
#
# Prints each thread's utime+stime (/proc/PID/task/*/stat fields 14 and 15) over the 2 s as a
# percentage of one CPU, busiest first.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
bin=${1:-$here/target/release/softrdma}
threads=${2:-4}
hz=$(getconf CLK_TCK)
"$bin" rpc bench --size 1M --transport rdma --calls 1000000 --threads "$threads" >/dev/null 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null || true' EXIT
sleep 1
snap() {
    for t in /proc/$pid/task/*; do
        echo "$(basename "$t") $(tr ' ' _ <"$t/comm" 2>/dev/null) $(awk '{print $14+$15}' "$t/stat" 2>/dev/null)"
    done | sort
}
a=$(snap)
sleep 2
z=$(snap)
echo "load: $(cut -d' ' -f1-3 /proc/loadavg); $threads callers"
join <(echo "$a") <(echo "$z") | awk -v hz="$hz" '{d = $5 - $3; if (d > 0) printf "%-20s %4.0f %%\n", $2, 100 * d / hz / 2}' | sort -k2 -nr
