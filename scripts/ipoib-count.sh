#!/usr/bin/env bash
# Per-packet counts of the two IPoIB daemons during iperf3 TCP (1 MiB writes) through ib0
# between two network namespaces: context switches, CPU time and system calls of both
# daemons (perf stat over SECONDS-2 s in the middle of the run) per packet sent on ib0.
# Counts, not timings: they hold better than throughput while other work loads the host
# (the CPU time is inflated by that load alike for every build measured in the same run).
# Usage (root, perf installed): scripts/ipoib-count.sh [MODE] [SECONDS] [BIN...]
#   MODE connected|datagram (default connected), SECONDS ≥ 4 (default 6), BIN: softrdma
#   builds to compare (default target/release/softrdma).
# Addresses: underlay 10.136.0.0/24, IPoIB 10.137.0.0/24 (unique to this script).
set -euo pipefail
mode="${1:-connected}"
secs="${2:-6}"
shift $(( $# > 2 ? 2 : $# ))
bins=("$@")
[ ${#bins[@]} -gt 0 ] || bins=("$(dirname "$0")/../target/release/softrdma")
. "$(dirname "$0")/lib/ipoib-ns.sh"
ipoib_ns_up ipc 10.136.0 5336
echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
for bin in "${bins[@]}"; do
    ipoib_ns_daemons "$bin" "$mode" 10.137.0 1000 /tmp/ipoib-count
    pa=$PA pb=$PB
    ip netns exec $A iperf3 -c 10.137.0.2 -p 5336 -t "$secs" -l 1M >/dev/null &
    pi=$!
    sleep 1
    t0=$(ip netns exec $A cat /sys/class/net/ib0/statistics/tx_packets)
    st=$(perf stat -x, -e context-switches,task-clock,raw_syscalls:sys_enter -p $pa,$pb -- sleep $((secs - 2)) 2>&1)
    t1=$(ip netns exec $A cat /sys/class/net/ib0/statistics/tx_packets)
    wait $pi
    python3 - "$bin" "$mode" "$((t1 - t0))" "$st" <<'PY'
import sys
bin, mode, n, st = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
v = {l.split(",")[2]: float(l.split(",")[0]) for l in st.splitlines() if l.count(",") >= 3 and l.split(",")[0][:1].isdigit()}
print(f"{bin} {mode}: {n} packets; per packet: {v['context-switches']/n:.2f} context switches, "
      f"{v['task-clock']*1000/n:.1f} us daemon CPU, {v['raw_syscalls:sys_enter']/n:.1f} system calls")
PY
    kill $pa $pb; wait $pa $pb 2>/dev/null || true
    sleep 0.5
done
echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
