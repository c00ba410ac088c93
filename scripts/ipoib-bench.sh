#!/usr/bin/env bash
# iperf3 TCP (1 MiB writes) between two network namespaces in one run: over the bare veth
# pair, over IPoIB datagram mode and over IPoIB connected mode on the same veth pair
# (softrdma ipoib up on RoCEv2). Prints one line per path and the ratios to veth.
# Usage (root): scripts/ipoib-bench.sh [SECONDS] [ROUNDS]   (default 5 s, 1 round)
# SOFTRDMA=BIN: the softrdma binary (default target/release/softrdma); SOFTRDMA_BEFORE=BIN:
# an older build measured in the same rounds too (rows "datagram-before", "connected-before"),
# for before/after ratios in one run. The load average is printed at the start and the end.
# Addresses: underlay 10.132.0.0/24, IPoIB 10.133.0.0/24 (unique to this script).
set -euo pipefail
secs="${1:-5}"
rounds="${2:-1}"
BIN="${SOFTRDMA:-$(dirname "$0")/../target/release/softrdma}"
A=ipbA$$; B=ipbB$$
cleanup() {
    for n in $A $B; do ip netns pids $n 2>/dev/null | xargs -r kill 2>/dev/null || true; done
    sleep 0.3
    for n in $A $B; do ip netns del $n 2>/dev/null || true; done
}
trap cleanup EXIT
for n in $A $B; do ip netns add $n; ip -n $n link set lo up; done
ip link add ipbva$$ type veth peer name ipbvb$$
ip link set ipbva$$ netns $A; ip link set ipbvb$$ netns $B
ip -n $A addr add 10.132.0.1/24 dev ipbva$$; ip -n $B addr add 10.132.0.2/24 dev ipbvb$$
ip -n $A link set ipbva$$ mtu 9000 up; ip -n $B link set ipbvb$$ mtu 9000 up
ip netns exec $B iperf3 -s -D -p 5333 >/dev/null

run() { # label dst
    local bps
    bps=$(ip netns exec $A iperf3 -c "$2" -p 5333 -t "$secs" -l 1M -J | python3 -c \
        'import json,sys; print(json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"])')
    echo "$1 $bps"
}
up() { # mode [binary]
    local BIN="${2:-$BIN}"
    ip netns exec $A "$BIN" ipoib up --dev ib0 --mode "$1" --underlay ipbva$$ --addr 10.133.0.1/24 >/tmp/ipoib-bench-A.log 2>&1 &
    ip netns exec $B "$BIN" ipoib up --dev ib0 --mode "$1" --underlay ipbvb$$ --addr 10.133.0.2/24 >/tmp/ipoib-bench-B.log 2>&1 &
    for _ in $(seq 100); do
        ip -n $B addr show dev ib0 2>/dev/null | grep -q 10.133.0.2 && ip -n $A addr show dev ib0 2>/dev/null | grep -q 10.133.0.1 && break
        sleep 0.1
    done
    ip netns exec $A ping -c 2 -W 3 -s 3000 10.133.0.2 >/dev/null
}
down() {
    for n in $A $B; do ip netns pids $n | while read -r p; do
        case "$(cat /proc/$p/comm 2>/dev/null)" in softrdma*) kill "$p" ;; esac; done; done
    sleep 0.5
}
out=$(mktemp)
echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
for r in $(seq "$rounds"); do
    run veth 10.132.0.2 >>"$out"
    up datagram; run datagram 10.133.0.2 >>"$out"; down
    up connected; run connected 10.133.0.2 >>"$out"; down
    if [ -n "${SOFTRDMA_BEFORE:-}" ]; then
        up datagram "$SOFTRDMA_BEFORE"; run datagram-before 10.133.0.2 >>"$out"; down
        up connected "$SOFTRDMA_BEFORE"; run connected-before 10.133.0.2 >>"$out"; down
    fi
done
echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$out" <<'PY'
import sys, collections
v = collections.defaultdict(list)
for line in open(sys.argv[1]):
    k, b = line.split(); v[k].append(float(b))
veth = sum(v["veth"]) / len(v["veth"])
for k in ("veth", "datagram", "connected", "datagram-before", "connected-before"):
    if k not in v:
        continue
    m = sum(v[k]) / len(v[k])
    print(f"{k:16s} {m/1e6:9.0f} Mbit/s  {m/veth:6.3f} x veth  (runs: {', '.join(f'{x/1e6:.0f}' for x in v[k])})")
PY
rm -f "$out"
