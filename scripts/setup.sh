#!/usr/bin/env bash
# Installs what softrdma's tests need on a fresh Debian/Ubuntu machine (idempotent):
# tshark (the external decoder of our captures), gcc with librdmacm-dev/libibverbs-dev (the
# guest's rdma_cm probe in the siw interop tests) and cargo-fuzz (the fuzz smoke run).
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
if ! command -v tshark >/dev/null 2>&1; then
    echo "setup: installing tshark"
    $SUDO apt-get update -qq
    # tshark asks whether non-root users may capture; the answer does not matter here.
    echo "wireshark-common wireshark-common/install-setuid boolean false" | $SUDO debconf-set-selections || true
    $SUDO apt-get install -y -qq tshark >/dev/null
fi
# The interop tests build a small rdma_cm program for the lab's guest (crates/cli/tests/guest/
# cm_probe.c) against the host's librdmacm/libibverbs (Debian's rdma-core, as in the guest).
if ! command -v gcc >/dev/null 2>&1 || [ ! -e /usr/include/rdma/rdma_cma.h ] || [ ! -e /usr/include/infiniband/verbs.h ]; then
    echo "setup: installing gcc librdmacm-dev libibverbs-dev"
    $SUDO apt-get update -qq
    $SUDO apt-get install -y -qq gcc librdmacm-dev libibverbs-dev >/dev/null
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "setup: installing cargo-fuzz"
    cargo install cargo-fuzz --locked --quiet
fi
