#!/usr/bin/env bash
# Where the time goes in iperf3 TCP (1 MiB writes) through ib0 between two namespaces
# (issue 16, session 13): CPU per thread of both sides (the IPoIB process's threads and
# both iperf3 processes) from /proc over SECONDS-3 s in the middle of the run, in % of one
# core and in µs per 64 KiB packet of ib0, plus system calls per packet (perf stat).
# With PERF=FILE also `perf record -g` of all of them into FILE.
# Every figure is also given per MiB delivered (iperf3's count), so the bare veth (mode veth:
# iperf3 alone, no IPoIB) compares with the others.
# Usage (root): scripts/ipoib-where.sh connected|relay|relay-crc|veth [SECONDS] [BIN]
#   connected: `BIN ipoib up --mode connected` (BIN default target/release/softrdma);
#   relay, relay-crc: crates/ipoib/examples/tun_relay (scripts/ipoib-bound.sh's bound).
# Addresses: underlay 10.140.0.0/24, IPoIB 10.141.0.0/24 (unique to this script).
set -euo pipefail
what="${1:-connected}"
secs="${2:-8}"
here="$(dirname "$0")"
BIN="${3:-$here/../target/release/softrdma}"
RELAY="${RELAY:-$here/../target/release/examples/tun_relay}"
. "$here/lib/ipoib-ns.sh"
ipoib_ns_up ipw 10.140.0 5340
case "$what" in
connected)
    ipoib_ns_daemons "$BIN" connected 10.141.0 1000 /tmp/ipoib-where ;;
relay|relay-crc)
    x=(); [ "$what" = relay-crc ] && x=(--crc)
    ip netns exec $A "$RELAY" ib0 10.141.0.1/24 10.140.0.1:4791 10.140.0.2:4791 "${x[@]}" >/tmp/ipoib-where-A.log 2>&1 &
    PA=$!
    ip netns exec $B "$RELAY" ib0 10.141.0.2/24 10.140.0.2:4791 10.140.0.1:4791 "${x[@]}" >/tmp/ipoib-where-B.log 2>&1 &
    PB=$!
    for _ in $(seq 100); do
        ip -n $B addr show dev ib0 2>/dev/null | grep -q 10.141.0.2 && ip -n $A addr show dev ib0 2>/dev/null | grep -q 10.141.0.1 && break
        sleep 0.1
    done
    ip netns exec $A ping -c 2 -W 3 -s 1000 10.141.0.2 >/dev/null ;;
veth) PA=""; PB="" ;;
*) echo "connected|relay|relay-crc|veth" >&2; exit 2 ;;
esac
dst=10.141.0.2; [ "$what" = veth ] && dst=10.140.0.2
echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
ip netns exec $A iperf3 -c $dst -p 5340 -t "$secs" -l 1M -J >/tmp/ipoib-where-iperf.json &
pi=$!
sleep 1.5
srv=$(ip netns pids $B | while read -r p; do [ "$(cat /proc/$p/comm)" = iperf3 ] && echo $p || true; done | head -1)
cli=$(ip netns pids $A | while read -r p; do [ "$(cat /proc/$p/comm)" = iperf3 ] && echo $p || true; done | head -1)
snap() { for p in $PA $PB $cli $srv; do for t in /proc/$p/task/*; do
    echo "$p $(basename $t) $(cut -d' ' -f2,14,15 $t/stat 2>/dev/null)"; done; done; }
dev=ib0; [ "$what" = veth ] && dev=$VA
s0=$(snap); t0=$(ip netns exec $A cat /sys/class/net/$dev/statistics/tx_packets)
r0=$(ip netns exec $A cat /sys/class/net/$dev/statistics/tx_bytes)
if [ -n "${PERF:-}" ]; then
    perf record -q -g -o "$PERF" -p $(echo $PA $PB $cli $srv | tr ' ' ,) -- sleep $((secs - 3)) 2>/dev/null
    st=""
else
    if [ -n "$PA" ]; then
        st=$(perf stat -x, -e context-switches,raw_syscalls:sys_enter -p $PA,$PB -- sleep $((secs - 3)) 2>&1)
    else
        sleep $((secs - 3)); st=""
    fi
fi
s1=$(snap); t1=$(ip netns exec $A cat /sys/class/net/$dev/statistics/tx_packets)
r1=$(ip netns exec $A cat /sys/class/net/$dev/statistics/tx_bytes)
wait $pi
echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$what" "$((t1 - t0))" "$((secs - 3))" "${PA:-x}" "${PB:-y}" "$cli" "$srv" "$s0" "$s1" "$st" "$((r1 - r0))" <<'PY'
import sys, os, json
what, n, secs = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
pa, pb, cli, srv = sys.argv[4:8]
mib = int(sys.argv[11]) / 2**20
role = {pa: "A (sender side)", pb: "B (receiver side)", cli: "iperf3 client", srv: "iperf3 server"}
hz = os.sysconf("SC_CLK_TCK")
def parse(s):
    d = {}
    for l in s.splitlines():
        f = l.split()
        if len(f) != 5: continue
        p, t, comm, u, k = f
        d[(p, t)] = (comm, int(u) + int(k))
    return d
a, b = parse(sys.argv[8]), parse(sys.argv[9])
bps = json.load(open("/tmp/ipoib-where-iperf.json"))["end"]["sum_received"]["bits_per_second"]
print(f"{what}: {bps/1e6:.0f} Mbit/s; {n} packets, {mib:.0f} MiB sent on the link in the {secs:.0f} s measured")
tot = 0
for k in sorted(b):
    if k not in a: continue
    comm, j = b[k][0], (b[k][1] - a[k][1]) / hz
    tot += j
    if j < 0.01 * secs: continue
    print(f"  {role[k[0]]:18s} {comm:16s} tid {k[1]:>7s} {100*j/secs:5.1f} % of a core  {1e6*j/max(n,1):7.1f} us/packet  {1e6*j/max(mib,1):6.0f} us/MiB")
print(f"  all of them: {100*tot/secs:.0f} % of a core, {1e6*tot/max(n,1):.1f} us/packet, {1e6*tot/max(mib,1):.0f} us/MiB")
st = sys.argv[10]
v = {l.split(",")[2]: float(l.split(",")[0]) for l in st.splitlines() if l.count(",") >= 3 and l.split(",")[0][:1].isdigit()}
if v and n:
    print(f"  both IPoIB sides: {v.get('context-switches',0)/n:.2f} context switches, {v.get('raw_syscalls:sys_enter',0)/n:.1f} system calls per packet")
PY
if [ "$what" = connected ]; then
    sleep 1.1 # the status file is rewritten every second
    ip netns exec $B "$BIN" ipoib show counters --dev ib0 | tee /tmp/ipoib-where-counters.txt | awk '
        $1 == "dev_rx_datagrams" {d=$2} $1 == "dev_rx_syscalls" {s=$2}
        $1 == "dev_rx_payload_copied" {p=$2} $1 == "ipoib_rc_received" {m=$2}
        END {if (d && m) printf "  B: %d RC messages received, %.1f datagrams and %.1f receive calls each, %.0f payload octets a datagram\n", m, d/m, s/m, p/d}'
fi
[ -z "$PA" ] || { kill $PA $PB 2>/dev/null; wait $PA $PB 2>/dev/null || true; }
case "$what" in relay*) cat /tmp/ipoib-where-A.log /tmp/ipoib-where-B.log ;; esac
