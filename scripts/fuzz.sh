#!/usr/bin/env bash
# The short fuzz pass of CI: builds the cargo-fuzz targets of fuzz/ (AddressSanitizer, debug
# assertions and overflow checks on) and runs each for FUZZ_SECONDS seconds, starting from
# the committed seed corpus in fuzz/corpus/<target>/ (read only: new inputs go to a scratch
# directory). A panic, sanitizer report, leak, input slower than FUZZ_TIMEOUT seconds or
# memory use above FUZZ_RSS_MB fails the pass; libFuzzer saves the input under
# fuzz/artifacts/<target>/, and `cargo +nightly fuzz run <target> <file>` replays it.
#
# Installs what it needs: the nightly toolchain (rustup; when it cannot be had, the pinned
# toolchain with RUSTC_BOOTSTRAP=1) and cargo-fuzz.
#
# Knobs:
#   FUZZ_SECONDS   seconds per target (default 60)
#   FUZZ_TARGETS   space-separated targets to run (default: all of `cargo fuzz list`)
#   FUZZ_TIMEOUT   seconds one input may take (default 30)
#   FUZZ_RSS_MB    memory limit in MiB (default 4096)
set -euo pipefail
cd "$(dirname "$0")/.."

seconds="${FUZZ_SECONDS:-60}"
per_input="${FUZZ_TIMEOUT:-30}"
rss_mb="${FUZZ_RSS_MB:-4096}"
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"

# cargo-fuzz passes nightly-only flags (-Zsanitizer). Without a nightly toolchain (none
# installed and none can be fetched), the pinned toolchain accepts them with RUSTC_BOOTSTRAP.
toolchain=(+nightly)
if ! rustup run nightly rustc --version >/dev/null 2>&1 &&
    ! rustup toolchain install nightly --profile minimal; then
    echo "fuzz: no nightly toolchain; using $(rustc --version) with RUSTC_BOOTSTRAP=1"
    toolchain=()
    export RUSTC_BOOTSTRAP=1
fi
if ! command -v cargo-fuzz >/dev/null 2>&1; then
    cargo install cargo-fuzz --locked
fi

if [ -n "${FUZZ_TARGETS:-}" ]; then
    read -r -a targets <<<"$FUZZ_TARGETS"
else
    mapfile -t targets < <(cargo "${toolchain[@]}" fuzz list)
fi

printf '\n== fuzz build (%s)\n' "${targets[*]}"
cargo "${toolchain[@]}" fuzz build -O --debug-assertions

scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT

passed=0
failed=0
for t in "${targets[@]}"; do
    printf '\n== fuzz %s (%ss)\n' "$t" "$seconds"
    mkdir -p "$scratch/$t" "fuzz/corpus/$t"
    log="$scratch/$t.log"
    if cargo "${toolchain[@]}" fuzz run -O --debug-assertions "$t" "$scratch/$t" "fuzz/corpus/$t" -- \
        -max_total_time="$seconds" -timeout="$per_input" -rss_limit_mb="$rss_mb" \
        -max_len=8192 -len_control=0 -print_final_stats=1 >"$log" 2>&1; then
        passed=$((passed + 1))
        grep -E '^Done [0-9]+ runs|^stat::number_of_executed_units|^stat::peak_rss_mb' "$log" || true
    else
        failed=$((failed + 1))
        # The report: libFuzzer's and the sanitizer's lines, the panic message, the input.
        grep -vE '^#[0-9]+[[:space:]]+(NEW|REDUCE|pulse|INITED)' "$log" | tail -n 80
    fi
done

printf '\nfuzz: %d passed, %d failed\n' "$passed" "$failed"
[ "$failed" -eq 0 ]
