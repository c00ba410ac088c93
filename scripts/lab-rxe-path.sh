#!/usr/bin/env bash
# A path to the lab guest's rxe0 that rdma_cm picks over siw0, without deleting siw0.
#
#   scripts/lab-rxe-path.sh [up|check]     (root; the lab VM running; hold the VM lock)
#
# Why: siw0 and rxe0 both sit on the guest's eth0. rdma_cm binds a source address to the
# first device whose GID matches it, and for an iWARP port that GID is the netdev's MAC, so
# every address on eth0 (or on a VLAN of eth0 with the same MAC) binds to siw0, which was
# registered first. Deleting siw0 works but can hang the 6.1 guest (docs/roce.md).
#
# What `up` builds (idempotent; a VM restart loses it, run `up` again):
#   guest: eth0.78, an 802.1Q VLAN of eth0 with its own MAC 02:00:00:77:78:02 and
#          192.168.78.2/24. rdma_cm skips siw0 for it (the MAC differs from siw0's GID),
#          and rxe0's GID table gets ::ffff:192.168.78.2 on eth0.78 (roce_gid_mgmt adds
#          the addresses of upper devices), so `rping -c -a 192.168.78.1`, `ib_*_bw -R
#          192.168.78.1`, `udaddy -s 192.168.78.1` ... bind to rxe0. rxe receives a VLAN
#          frame through the VLAN's real device (eth0 -> rxe0).
#          The host side cannot tag frames (no 8021q, no vlan_filtering, no act_vlan in the
#          host kernel), so the wire stays untagged and the guest tags in tc: on eth0's
#          ingress, frames to 02:00:00:77:78:02 get VLAN 78 pushed (so they arrive on
#          eth0.78); on its egress, VLAN 78 is popped. Modules 8021q (+llc stp garp mrp),
#          sch_ingress, cls_flower, act_vlan come from the lab kernel's module tree and the
#          `tc` binary (+ libs) from the host, through the 9p share ($LAB_STATE/share ->
#          /mnt/host in the guest).
#          RoCEv2 multicast (mckey, issue 14): a datagram to an IPv4 group goes to MAC
#          01:00:5e:..., not to eth0.78's, so it would arrive untagged on eth0, which has not
#          joined the group (rxe joins on eth0.78), and IP would drop it. One more ingress
#          rule pushes VLAN 78 for IPv4 multicast from 192.168.78.0/24 to UDP 4791.
#   host:  192.168.78.1/24 on br0 in namespace rdmalab and a permanent neighbour entry
#          192.168.78.2 -> 02:00:00:77:78:02 (otherwise eth0 would answer the untagged ARP
#          with its own MAC and rxe0 would drop the frames: its GID for 78.2 is on eth0.78).
# `check`: exits 0 if the path is up (guest GID and multicast rule present, host address and
# neighbour present).
set -euo pipefail

LAB=${RDMALAB_REPO:-$(dirname "$0")/../../shared/lab}
STATE=${LAB_STATE:-/var/tmp/rdmalab}
NS=rdmalab
VID=78
MAC=02:00:00:77:78:02
GUEST=192.168.78.2
HOST=192.168.78.1
SHARE=$STATE/share/rxe-path

die() { echo "lab-rxe-path: $*" >&2; exit 1; }
[ -x "$LAB/vm.sh" ] || die "no lab scripts at $LAB (set RDMALAB_REPO)"
vm() { (cd "$LAB" && ./vm.sh exec -t 60 -); }

guest_ok() {
  local out
  out=$(echo "for n in /sys/class/infiniband/rxe0/ports/1/gid_attrs/ndevs/*; do \
          [ \"\$(cat \$n 2>/dev/null)\" = eth0.$VID ] && \
          grep -q 'ffff:c0a8:4e02' /sys/class/infiniband/rxe0/ports/1/gids/\${n##*/} && echo rxe-path-ok; done; \
        S=/mnt/host/rxe-path; [ -x \$S/tc ] && LD_LIBRARY_PATH=\$S/lib \$S/tc filter show dev eth0 ingress | \
          grep -q 'dst_port 4791' && echo rxe-mcast-ok; true" \
    | vm) || return 1
  [[ $out == *rxe-path-ok* && $out == *rxe-mcast-ok* ]]
}
host_ok() {
  ip -n $NS -br addr show dev br0 | grep -q "$HOST/24" &&
    ip -n $NS neigh show $GUEST dev br0 | grep -q "$MAC"
}

case "${1:-up}" in
  check) guest_ok && host_ok; exit ;;
  up) ;;
  *) die "usage: $0 [up|check]" ;;
esac

if guest_ok; then
  was_up=1
else
  was_up=0
  kdir=$(ls -d "$STATE"/kernel/*/lib/modules/*/kernel 2>/dev/null | head -1)
  [ -n "$kdir" ] || die "no kernel module tree under $STATE/kernel (run the lab's setup.sh)"
  mkdir -p "$SHARE/lib"
  for m in llc stp garp mrp 8021q sch_ingress cls_flower act_vlan; do
    f=$(find "$kdir" -name "$m.ko" | head -1)
    [ -n "$f" ] || die "module $m.ko not in $kdir"
    cp -f "$f" "$SHARE/"
  done
  tc=$(command -v tc) || die "no tc on the host"
  cp -f "$tc" "$SHARE/tc"
  ldd "$tc" | awk '$3 ~ /^\// {print $3}' | while read -r l; do cp -fL "$l" "$SHARE/lib/"; done
  vm <<EOF
set -e
S=/mnt/host/rxe-path
for m in llc stp garp mrp 8021q sch_ingress cls_flower act_vlan; do
  grep -q "^\$m " /proc/modules || insmod \$S/\$m.ko
done
IP=/usr/bin/ip
[ -e /sys/class/net/eth0.$VID ] || \$IP link add link eth0 name eth0.$VID address $MAC type vlan id $VID
\$IP addr replace $GUEST/24 dev eth0.$VID
\$IP link set eth0.$VID up
export LD_LIBRARY_PATH=\$S/lib
T=\$S/tc
\$T qdisc show dev eth0 | grep -q clsact || \$T qdisc add dev eth0 clsact
\$T filter show dev eth0 ingress | grep -q "dst_mac $MAC" || \
  \$T filter add dev eth0 ingress protocol all flower dst_mac $MAC action vlan push id $VID
\$T filter show dev eth0 egress | grep -q "vlan_id $VID" || \
  \$T filter add dev eth0 egress protocol 802.1Q flower vlan_id $VID action vlan pop
\$T filter show dev eth0 ingress | grep -q "dst_port 4791" || \
  \$T filter add dev eth0 ingress protocol ip flower dst_mac 01:00:5e:00:00:00/ff:ff:ff:80:00:00 \
    src_ip 192.168.78.0/24 ip_proto udp dst_port 4791 action vlan push id $VID
EOF
fi
ip -n $NS addr replace $HOST/24 dev br0
ip -n $NS neigh replace $GUEST lladdr $MAC dev br0 nud permanent
[ $was_up = 1 ] && exit 0
for _ in $(seq 20); do guest_ok && exit 0; sleep 0.2; done
die "rxe0 has no GID for $GUEST on eth0.$VID"
