#!/usr/bin/env bash
# Runs every cargo-fuzz target in fuzz/ (libFuzzer; needs a nightly toolchain and
# `cargo install cargo-fuzz`) for SECONDS each (default 60), then prints the run counts.
# A crash leaves its input under fuzz/artifacts/TARGET/ and stops with a non-zero status.
#
#   scripts/fuzz.sh [SECONDS] [TARGET...]
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
secs="${1:-60}"
shift || true
targets=("$@")
if [[ ${#targets[@]} -eq 0 ]]; then
    mapfile -t targets < <(cargo +nightly fuzz list)
fi
cargo +nightly fuzz build -O
for t in "${targets[@]}"; do
    echo "== $t: ${secs} s"
    log="target/fuzz-$t.log"
    status=0
    cargo +nightly fuzz run -O "$t" -- -max_total_time="$secs" -print_final_stats=1 \
        >"$log" 2>&1 || status=$?
    grep -E "^Done|SUMMARY|panicked|ERROR|Test unit written" "$log" || true
    if [[ $status -ne 0 ]]; then
        echo "$t failed (status $status); the whole output is in fuzz/$log" >&2
        exit "$status"
    fi
done
