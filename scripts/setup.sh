#!/usr/bin/env bash
# Installs what softrdma's tests need on a fresh Debian/Ubuntu machine (idempotent):
# tshark (the external decoder of our captures) and cargo-fuzz (the fuzz smoke run).
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
if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "setup: installing cargo-fuzz"
    cargo install cargo-fuzz --locked --quiet
fi
