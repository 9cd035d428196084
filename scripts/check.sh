#!/usr/bin/env bash
# The full pmfs test suite: system packages, formatting, lints, tests with and without the
# libpmem backend. Runs on a fresh Debian 12 machine as root (CI) or with sudo available.
#
# Knobs for longer local runs (CI keeps the defaults):
#   PROPTEST_CASES   proptest cases per property (default 64 here)
#   PMFS_CRASH_SAMPLES  post-crash images sampled per fence when not exhaustive (default 64)
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(pkg-config libpmem-dev libclang-dev clang fuse3 libfuse3-dev)
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}"
fi

export PROPTEST_CASES="${PROPTEST_CASES:-64}"
export PMFS_CRASH_SAMPLES="${PMFS_CRASH_SAMPLES:-64}"
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"

step() { printf '\n== %s\n' "$*"; }

step "rustfmt"
cargo fmt --all -- --check

step "clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings
cargo clippy --workspace --all-targets --locked --features pmfs-core/libpmem -- -D warnings

step "tests (memmap2 backend)"
cargo test --workspace --locked

step "tests (libpmem backend)"
cargo test --workspace --locked --features pmfs-core/libpmem
