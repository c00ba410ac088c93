#!/usr/bin/env bash
# The whole softrdma test suite (README's second command; .ci/run calls exactly this).
#   1. installs tshark and cargo-fuzz if missing (scripts/setup.sh)
#   2. cargo test over the workspace (unit, property, golden-vector, tshark and end-to-end tests)
#   3. a short fuzz run of every decoder (FUZZ_SECONDS per target, default 6)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cargo test --workspace --release --all-targets --no-fail-fast
bash scripts/fuzz-smoke.sh
