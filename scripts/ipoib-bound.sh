#!/usr/bin/env bash
# The bound for IPoIB connected mode (issue 16, session 13): iperf3 TCP (1 MiB writes)
# between two network namespaces over the bare veth pair, through the simplest user-space
# relay over kernel UDP (crates/ipoib/examples/tun_relay.rs: TUN with the daemon's offloads
# and MTU 65,520, 4 KiB segments as UDP GSO trains, UDP_GRO receive scattered in place, no
# verbs), the same relay with a CRC-32 pass per segment (the ICRC), and `softrdma ipoib up
# --mode connected`, all in one run. Prints each path's mean and its ratio to the veth.
# Usage (root): scripts/ipoib-bound.sh [SECONDS] [ROUNDS]   (default 5 s, 3 rounds)
# SOFTRDMA=BIN (default target/release/softrdma), SOFTRDMA_BEFORE=BIN: an older build
# measured in the same rounds (row "connected-before"); RELAY=BIN: the relay (default
# target/release/examples/tun_relay; build it with
# `cargo build -p ipoib --release --example tun_relay`).
# Addresses: underlay 10.138.0.0/24, IPoIB 10.139.0.0/24, relay UDP port 4791 (unique to
# this script).
set -euo pipefail
secs="${1:-5}"
rounds="${2:-3}"
here="$(dirname "$0")"
BIN="${SOFTRDMA:-$here/../target/release/softrdma}"
RELAY="${RELAY:-$here/../target/release/examples/tun_relay}"
. "$here/lib/ipoib-ns.sh"
ipoib_ns_up ibd 10.138.0 5338

run() { ipoib_ns_run "$1" "$2" "$secs"; }
down() { ipoib_ns_stop softrdma tun_relay; }
relay() { # extra-args
    ip netns exec $A "$RELAY" ib0 10.139.0.1/24 10.138.0.1:4791 10.138.0.2:4791 "$@" >>/tmp/ipoib-bound-A.log 2>&1 &
    ip netns exec $B "$RELAY" ib0 10.139.0.2/24 10.138.0.2:4791 10.138.0.1:4791 "$@" >>/tmp/ipoib-bound-B.log 2>&1 &
    for _ in $(seq 100); do
        ip -n $B addr show dev ib0 2>/dev/null | grep -q 10.139.0.2 && ip -n $A addr show dev ib0 2>/dev/null | grep -q 10.139.0.1 && break
        sleep 0.1
    done
    ip netns exec $A ping -c 2 -W 3 -s 60000 10.139.0.2 >/dev/null
}
echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
for r in $(seq "$rounds"); do
    run veth 10.138.0.2
    relay; run bound 10.139.0.2; down
    relay --crc; run bound+crc 10.139.0.2; down
    ipoib_ns_daemons "$BIN" connected 10.139.0 3000 /tmp/ipoib-bound; run connected 10.139.0.2; down
    if [ -n "${SOFTRDMA_BEFORE:-}" ]; then
        ipoib_ns_daemons "$SOFTRDMA_BEFORE" connected 10.139.0 3000 /tmp/ipoib-bound
        run connected-before 10.139.0.2; down
    fi
done
echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
ipoib_ns_report veth bound bound+crc connected connected-before
