# Sourced by scripts/ipoib-bench.sh, scripts/ipoib-bound.sh and scripts/ipoib-count.sh: two
# network namespaces joined by a veth pair (MTU 9000) with an iperf3 server in the second,
# removed on exit; iperf3 runs through them and their means.
#
#   ipoib_ns_up TAG NET PORT
#     TAG: a short name unique to the calling script (namespaces ${TAG}A$$ / ${TAG}B$$, veths
#     ${TAG}va$$ / ${TAG}vb$$); NET: the underlay's first three octets (NET.1 in A, NET.2 in B,
#     /24); PORT: the iperf3 server's port in B. Sets A, B (namespaces), VA, VB (veths) and an
#     EXIT trap that kills what runs in the namespaces and deletes them.
#   ipoib_ns_daemons BIN MODE NET PING_SIZE LOG
#     Starts `BIN ipoib up` (MODE datagram|connected) in A and B on the veths with NET.1/24
#     and NET.2/24 on ib0, waits (10 s at most) until both addresses are set, then pings
#     across with PING_SIZE octets. Sets PA, PB (the daemons: `ip netns exec` execs them);
#     their output goes to LOG-A.log and LOG-B.log.
#   ipoib_ns_run LABEL DST SECS
#     iperf3 TCP (1 MiB writes, SECS s) from A to the server in B at DST; appends "LABEL
#     bits/s received" to the file $IPOIB_NS_OUT (made by ipoib_ns_up, removed on exit).
#   ipoib_ns_stop COMM...
#     Kills the processes in A and B whose name starts with one of COMM (softrdma, tun_relay),
#     then waits 0.5 s.
#   ipoib_ns_report ROW...
#     For each ROW run at least once ("veth" must be): its mean in Mbit/s, its ratio to the
#     veth's mean and each run, one line.

ipoib_ns_cleanup() {
    for n in $A $B; do ip netns pids $n 2>/dev/null | xargs -r kill 2>/dev/null || true; done
    sleep 0.3
    for n in $A $B; do ip netns del $n 2>/dev/null || true; done
    rm -f "$IPOIB_NS_OUT"
}

ipoib_ns_up() { # tag net port
    A=$1A$$; B=$1B$$; VA=$1va$$; VB=$1vb$$; IPOIB_NS_PORT=$3
    IPOIB_NS_OUT=$(mktemp)
    trap ipoib_ns_cleanup EXIT
    for n in $A $B; do ip netns add $n; ip -n $n link set lo up; done
    ip link add $VA type veth peer name $VB
    ip link set $VA netns $A; ip link set $VB netns $B
    ip -n $A addr add "$2.1/24" dev $VA; ip -n $B addr add "$2.2/24" dev $VB
    ip -n $A link set $VA mtu 9000 up; ip -n $B link set $VB mtu 9000 up
    ip netns exec $B iperf3 -s -D -p "$3" >/dev/null
}

ipoib_ns_daemons() { # bin mode net ping-size log
    ip netns exec $A "$1" ipoib up --dev ib0 --mode "$2" --underlay $VA --addr "$3.1/24" >"$5-A.log" 2>&1 &
    PA=$!
    ip netns exec $B "$1" ipoib up --dev ib0 --mode "$2" --underlay $VB --addr "$3.2/24" >"$5-B.log" 2>&1 &
    PB=$!
    for _ in $(seq 100); do
        ip -n $B addr show dev ib0 2>/dev/null | grep -q "$3.2" && ip -n $A addr show dev ib0 2>/dev/null | grep -q "$3.1" && break
        sleep 0.1
    done
    ip netns exec $A ping -c 2 -W 3 -s "$4" "$3.2" >/dev/null
}

ipoib_ns_run() { # label dst secs
    local bps
    bps=$(ip netns exec $A iperf3 -c "$2" -p "$IPOIB_NS_PORT" -t "$3" -l 1M -J | python3 -c \
        'import json,sys; print(json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"])')
    echo "$1 $bps" >>"$IPOIB_NS_OUT"
}

ipoib_ns_stop() { # comm...
    local p c n want
    for n in $A $B; do ip netns pids $n | while read -r p; do
        c="$(cat /proc/$p/comm 2>/dev/null || true)"
        for want in "$@"; do case "$c" in "$want"*) kill "$p"; break ;; esac; done
    done; done
    sleep 0.5
}

ipoib_ns_report() { # row...
    python3 - "$IPOIB_NS_OUT" "$@" <<'PY'
import sys, collections
v = collections.defaultdict(list)
for line in open(sys.argv[1]):
    k, b = line.split(); v[k].append(float(b))
veth = sum(v["veth"]) / len(v["veth"])
for k in sys.argv[2:]:
    if k not in v:
        continue
    m = sum(v[k]) / len(v[k])
    print(f"{k:16s} {m/1e6:9.0f} Mbit/s  {m/veth:6.3f} x veth  (runs: {', '.join(f'{x/1e6:.0f}' for x in v[k])})")
PY
}
