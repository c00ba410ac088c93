#!/usr/bin/env bash
# Where `rpc bench --size 1M`'s time goes, per thread role, for each transport (issue 18,
# docs/performance.md "Session 14: RPC 1 MiB and NFS"). For CALLS calls of each transport
# alone it prints, per call, each role's CPU time, its time runnable but waiting for a CPU
# (run-queue delay) and its timeslices (about one per wake-up), from
# /proc/PID/task/*/schedstat sampled every 20 ms until the process exits (warm-up and setup
# included; they are a few calls).
#
#   scripts/rpc-schedstat.sh [BINARY=target/release/softrdma] [THREADS=1] [CALLS=3000]
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
bin=${1:-$here/target/release/softrdma}
threads=${2:-1}
calls=${3:-3000}
out=$(mktemp)
trap 'rm -f "$out" "$out.json"' EXIT
for transport in tcp rdma; do
    : >"$out"
    load=$(cut -d' ' -f1 /proc/loadavg)
    "$bin" rpc bench --size 1M --transport "$transport" --calls "$calls" --threads "$threads" --json >"$out.json" 2>/dev/null &
    pid=$!
    while kill -0 $pid 2>/dev/null; do
        # bash builtins only: a fork per thread would make the sampling slower than the run
        for t in /proc/$pid/task/*; do
            { read -r s <"$t/schedstat" && read -r c <"$t/comm"; } 2>/dev/null || continue
            echo "${t##*/} ${c// /_} $s"
        done >>"$out"
        sleep 0.02
    done
    wait $pid || true
    mbs=$(sed -n 's/.*"mb_per_s":\([0-9.]*\).*/\1/p' "$out.json" | cut -d. -f1)
    echo "== $transport: $threads caller(s), $calls calls, $mbs MB/s, load $load"
    # the last sample of each thread; per role (name without its digits): per call
    awk -v c="$calls" '{last[$1] = $0} END {for (t in last) print last[t]}' "$out" |
        awk -v c="$calls" '{n=$2; gsub(/[-0-9]+$/, "", n); cpu[n]+=$3/1e3; w[n]+=$4/1e3; sl[n]+=$5; T+=$3/1e3; W+=$4/1e3; S+=$5}
            END {for (n in cpu) if (cpu[n] / c >= 1) printf "  %-18s cpu %6.0f us  runq-wait %6.0f us  timeslices %5.1f  per call\n", n, cpu[n]/c, w[n]/c, sl[n]/c;
                 printf "  %-18s cpu %6.0f us  runq-wait %6.0f us  timeslices %5.1f  per call\n", "(all threads)", T/c, W/c, S/c}' | sort -k3 -nr
done
