#!/bin/bash
# The benchmark figures of docs/performance.md ("Quiet rerun after session 12's merge"), each
# ours against its baseline in the same run, three rounds, on a machine with nothing else on it.
# Needs a release build (`CARGO_PROFILE_RELEASE_LTO=false cargo build --release --all-targets`, as
# CI builds it), root (the IPoIB and NFS scripts use namespaces and ports), iperf3.
#   scripts/quiet-rerun.sh [OUT_DIR=/tmp/quiet]     # one file per figure in OUT_DIR, then OUT_DIR/DONE
cd "$(dirname "$0")/.."
B=target/release/softrdma
export CARGO_PROFILE_RELEASE_LTO=false
O=${1:-/tmp/quiet}; mkdir -p "$O"
r() { local name=$1; shift; echo "### $(date +%T) load $(cut -d' ' -f1 /proc/loadavg): $*" >> $O/$name.txt; timeout 300 "$@" >> $O/$name.txt 2>&1; }
for i in 1 2 3; do
  r iw_send $B bench send --lat --size 8 --iters 20000 --baseline tcp
  r iw_write $B bench write --lat --size 8 --iters 20000 --baseline tcp
  r iw_read $B bench read --lat --size 8 --iters 20000 --baseline tcp
  r iw_send_64B $B bench send --lat --size 64 --iters 20000 --baseline tcp     # session 14: 8-64 B
  r iw_write_64B $B bench write --lat --size 64 --iters 20000 --baseline tcp
  r iw_read_64B $B bench read --lat --size 64 --iters 20000 --baseline tcp
  r iw_send_ev $B bench send --lat --events --size 8 --iters 5000 --baseline tcp
  r roce_send $B bench send --lat --size 8 --iters 10000 --provider roce --baseline udp --loopback 127.0.95.21
  r roce_send_ev $B bench send --lat --events --size 8 --iters 2000 --provider roce --baseline udp --loopback 127.0.95.23
  r roce_write1m $B bench write --provider roce --size 1M --iters 1000 --baseline tcp --loopback 127.0.95.1
  r roce_write64 $B bench write --provider roce -s 64 -t 64 -D 2 --loopback 127.0.95.11
  r rpc1m $B rpc bench --size 1M --transport both --calls 300
  r rpc1m4 $B rpc bench --size 1M --transport both --calls 300 --threads 4
  r rpc_sched bash scripts/rpc-schedstat.sh $B 1
  r rpc_null_ev $B rpc bench --proc null --transport both --calls 2000
  r rpc_null_busy $B rpc bench --proc null --transport both --calls 2000 --busy-poll
  r rpc_echo_ev $B rpc bench --proc echo --size 64 --transport both --calls 2000
  r rpc_echo_busy $B rpc bench --proc echo --size 64 --transport both --calls 2000 --busy-poll
  r smc_bench $B smc bench -n 10000
  r smc_bench_busy $B smc bench --busy -n 10000
done
cargo build -p roce --release --example udp_bound >/dev/null 2>&1 && r roce_bound target/release/examples/udp_bound 2 3
cargo build -p roce --release --example udp_latency_bound >/dev/null 2>&1 && r roce_lat_bound target/release/examples/udp_latency_bound 20000 3 127.0.96.61
cargo build -p smc --release --example smc_latency_bound >/dev/null 2>&1 && r smc_lat_bound target/release/examples/smc_latency_bound 10000 3 127.0.97.71
r iw_write1m $B bench write --size 1M --iters 2000 --baseline tcp
r iw_write64 $B bench write -s 64 -t 64 -D 2
r smc_stream cargo test -p smc --release --test stream_roce -- --ignored --nocapture streaming_ratio
r smc_stream cargo test -p smc --release --test stream_roce -- --ignored --nocapture streaming_ratio
r nfs bash scripts/nfs-bench.sh 1024 2
cargo build -p rpcrdma --release --example rpc_read_bound >/dev/null 2>&1 && r rpc_bound target/release/examples/rpc_read_bound 1048576 1000 3
r ipoib bash scripts/ipoib-bench.sh 5 3
cargo build -p ipoib --release --example tun_relay >/dev/null 2>&1 && r ipoib_bound bash scripts/ipoib-bound.sh 5 3
echo done > $O/DONE
