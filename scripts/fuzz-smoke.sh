#!/usr/bin/env bash
# Runs every fuzz target for a few seconds (a smoke run, not a campaign).
# Every target in fuzz/Cargo.toml runs (`cargo fuzz list`): the iWARP decoders and QP core, the
# rpcrdma decoders, the RoCEv2 wire decoders (roce_packet, roce_headers), the RC core (roce_rc) and
# the DETH + UD receive path (roce_ud). Seeds in fuzz/seeds/<target>.
# cargo-fuzz needs nightly flags; RUSTC_BOOTSTRAP=1 lets the stable toolchain accept them.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
secs="${FUZZ_SECONDS:-6}"
export RUSTC_BOOTSTRAP=1
targets=$(cargo fuzz list)
cargo fuzz build -O $targets >/dev/null 2>&1 || cargo fuzz build -O
pass=0; fail=0
for t in $targets; do
    mkdir -p "corpus/$t"
    if [ -d "seeds/$t" ]; then cp -n seeds/$t/* "corpus/$t/" 2>/dev/null || true; fi
    if cargo fuzz run -O "$t" "corpus/$t" -- -max_total_time="$secs" -rss_limit_mb=2048 -max_len=70000 >"/tmp/fuzz-$t.log" 2>&1; then
        runs=$(grep -o 'Done [0-9]* runs' "/tmp/fuzz-$t.log" | tail -1)
        echo "fuzz $t: ok (${runs:-?})"
        pass=$((pass+1))
    else
        echo "fuzz $t: FAILED, see /tmp/fuzz-$t.log"; tail -30 "/tmp/fuzz-$t.log"
        fail=$((fail+1))
    fi
done
echo "fuzz: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
