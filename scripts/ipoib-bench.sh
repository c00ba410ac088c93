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
. "$(dirname "$0")/lib/ipoib-ns.sh"
ipoib_ns_up ipb 10.132.0 5333

up() { # mode [binary]
    local BIN="${2:-$BIN}"
    ipoib_ns_daemons "$BIN" "$1" 10.133.0 3000 /tmp/ipoib-bench
}
run() { ipoib_ns_run "$1" "$2" "$secs"; }
down() { ipoib_ns_stop softrdma; }
echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
for r in $(seq "$rounds"); do
    run veth 10.132.0.2
    up datagram; run datagram 10.133.0.2; down
    up connected; run connected 10.133.0.2; down
    if [ -n "${SOFTRDMA_BEFORE:-}" ]; then
        up datagram "$SOFTRDMA_BEFORE"; run datagram-before 10.133.0.2; down
        up connected "$SOFTRDMA_BEFORE"; run connected-before 10.133.0.2; down
    fi
done
echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
ipoib_ns_report veth datagram connected datagram-before connected-before
