#!/usr/bin/env bash
# Installs what softrdma's tests need on a fresh Debian/Ubuntu machine (idempotent):
# tshark (the external decoder of our captures), g++ (libFuzzer), gcc with librdmacm-dev/libibverbs-dev (the
# guest's rdma_cm probe in the siw interop tests) and cargo-fuzz (the fuzz smoke run).
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then
        SUDO="sudo"
    else
        echo "setup: not root and no sudo; install tshark, g++, librdmacm-dev, libibverbs-dev as root, or run this as root" >&2
        exit 1
    fi
fi
if ! command -v tshark >/dev/null 2>&1; then
    echo "setup: installing tshark"
    $SUDO apt-get update -qq
    # tshark asks whether non-root users may capture; the answer does not matter here.
    echo "wireshark-common wireshark-common/install-setuid boolean false" | $SUDO debconf-set-selections || true
    $SUDO apt-get install -y -qq tshark >/dev/null
fi
# libFuzzer (cargo fuzz) is C++ and needs g++.
if ! command -v g++ >/dev/null 2>&1; then
    echo "setup: installing g++"
    $SUDO apt-get update -qq
    $SUDO apt-get install -y -qq g++ >/dev/null
fi
# The interop tests build a small rdma_cm program for the lab's guest (crates/cli/tests/guest/
# cm_probe.c) against the host's librdmacm/libibverbs (Debian's rdma-core, as in the guest).
if ! command -v gcc >/dev/null 2>&1 || [ ! -e /usr/include/rdma/rdma_cma.h ] || [ ! -e /usr/include/infiniband/verbs.h ]; then
    echo "setup: installing gcc librdmacm-dev libibverbs-dev"
    $SUDO apt-get update -qq
    $SUDO apt-get install -y -qq gcc librdmacm-dev libibverbs-dev >/dev/null
fi
# iputils ping (-M do, "message too long") and iperf3 for the IPoIB namespace tests
# (crates/cli/tests/ipoib_cm_netns.rs; busybox ping has neither); `softrdma smc run` tests
# (crates/cli/tests/smc_run.rs) drive unmodified programs: OpenBSD netcat (-N half-close), curl,
# iperf3 (python3 is already needed).
if ! ping -V 2>/dev/null | grep -q iputils || ! command -v iperf3 >/dev/null 2>&1 \
    || ! command -v curl >/dev/null 2>&1 || ! nc -h 2>&1 | grep -q OpenBSD; then
    echo "setup: installing iputils-ping iperf3 curl netcat-openbsd"
    $SUDO apt-get update -qq
    # iperf3's package asks whether to run a system-wide server: no.
    echo "iperf3 iperf3/start_daemon boolean false" | $SUDO debconf-set-selections || true
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq iputils-ping iperf3 curl netcat-openbsd >/dev/null
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "setup: installing cargo-fuzz"
    cargo install cargo-fuzz --locked --quiet
fi
