#!/usr/bin/env bash
# The full pmfs test suite: system packages, formatting, lints, tests with and without the
# libpmem backend, loom models and a short fuzz pass. Runs on a fresh Debian 12 machine as
# root (CI) or with sudo available.
#
# Knobs for longer local runs (CI keeps the defaults):
#   PROPTEST_CASES         proptest cases per property (default 64 here)
#   PMFS_CRASH_SAMPLES     post-crash images sampled per crash point when not exhaustive (unset:
#                          each sweep's own default, 64, 8 or 4, see README)
#   PMFS_CRASH_SEQUENCES   random operation sequences per mapping cut by crashes (default 2)
#   LOOM_MAX_PREEMPTIONS   loom's preemption bound (default 2)
#   FUZZ_SECONDS           seconds per fuzz target (default 60); PMFS_SKIP_FUZZ=1 skips it
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(pkg-config libpmem-dev libclang-dev clang gcc fuse3 sqlite3 attr fio)
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
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"

step() { printf '\n== %s\n' "$*"; }

step "rustfmt"
cargo fmt --all -- --check

step "clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings
cargo clippy --workspace --all-targets --locked --features pmfs-core/libpmem -- -D warnings

step "tests (default features)"
cargo test --workspace --locked

# The libpmem feature changes pmfs-core's region backends only; its users run above.
step "tests (libpmem backend)"
cargo test --locked -p pmem -p pmfs-core --features pmfs-core/libpmem

step "loom models"
RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS="${LOOM_MAX_PREEMPTIONS:-2}" \
    CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target}/loom" \
    cargo test --locked -p pmfs-core --release --test loom_log --test loom_digest
RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS="${LOOM_MAX_PREEMPTIONS:-2}" \
    CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target}/loom" \
    cargo test --locked -p pmfs-mapping --release --test loom_hashfs

if [ "${PMFS_SKIP_FUZZ:-0}" != 1 ]; then
    step "fuzz"
    bash scripts/fuzz.sh
fi
