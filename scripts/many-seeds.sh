#!/usr/bin/env bash
# Runs seeded tests over many fresh seeds and reports the seeds that fail. Not part of CI: a
# way to find flaky tests before a newcomer does.
#
#   scripts/many-seeds.sh [-n SEEDS] CARGO_TEST_ARGS... [-- TEST_FILTERS...]
#
# e.g.  scripts/many-seeds.sh -n 200 -p pushpull-codecs --test properties
#       scripts/many-seeds.sh -n 200 -p pushpull-proto --lib -- protocol:: sendq::
#
# CARGO_TEST_ARGS select the test binaries (built once with `cargo test --no-run`); each seed
# runs every selected binary once, with TEST_FILTERS (libtest name filters) after it. A seed
# is a fresh u64 from /dev/urandom, given as both PUSHPULL_TEST_SEED (read by the tests'
# `seed()` helpers: codecs/tests/common, kernels/tests/cuda_common, worker/tests/common,
# tests/common) and PROPTEST_RNG_SEED (read by proptest's default config, which proto's
# `proptest!` blocks use). Replay a failure with the printed variables.
#
# Prints one line per test (runs, failures, failing seeds); exits 1 if any test failed.
set -euo pipefail

seeds=200
if [[ "${1:-}" == "-n" ]]; then
    seeds="$2"
    shift 2
fi
cargo_args=()
while [[ $# -gt 0 && "$1" != "--" ]]; do
    cargo_args+=("$1")
    shift
done
[[ "${1:-}" == "--" ]] && shift
filters=("$@")
if [[ ${#cargo_args[@]} -eq 0 ]]; then
    sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
fi

mapfile -t exes < <(cargo test --no-run --message-format=json "${cargo_args[@]}" |
    jq -r 'select(.reason == "compiler-artifact" and .executable != null) | .executable')
if [[ ${#exes[@]} -eq 0 ]]; then
    echo "many-seeds: cargo built no test binary for: ${cargo_args[*]}" >&2
    exit 2
fi

declare -A runs fails bad
log=$(mktemp)
trap 'rm -f "$log"' EXIT
start=$SECONDS
for ((s = 1; s <= seeds; s++)); do
    seed=$(od -An -N8 -tu8 /dev/urandom | tr -d ' ')
    for exe in "${exes[@]}"; do
        bin=$(basename "$exe" | sed 's/-[0-9a-f]*$//')
        PUSHPULL_TEST_SEED=$seed PROPTEST_RNG_SEED=$seed \
            PROPTEST_DISABLE_FAILURE_PERSISTENCE=1 RUST_BACKTRACE=0 \
            "$exe" "${filters[@]}" >"$log" 2>&1 || true
        while read -r name result; do
            t="$bin::$name"
            runs[$t]=$((${runs[$t]:-0} + 1))
            if [[ "$result" == FAILED ]]; then
                fails[$t]=$((${fails[$t]:-0} + 1))
                bad[$t]="${bad[$t]:-} $seed"
                echo "FAILED $t with PUSHPULL_TEST_SEED=$seed PROPTEST_RNG_SEED=$seed" >&2
                grep -A20 "^---- $name stdout ----" "$log" | head -25 >&2 || true
            fi
        done < <(sed -n 's/^test \(.*\) \.\.\. \(ok\|FAILED\)$/\1 \2/p' "$log")
        if ! grep -q '^test result:' "$log"; then
            echo "many-seeds: $bin exited without a result at seed $seed:" >&2
            tail -20 "$log" >&2
            bad["$bin (crashed)"]="${bad["$bin (crashed)"]:-} $seed"
            fails["$bin (crashed)"]=$((${fails["$bin (crashed)"]:-0} + 1))
            runs["$bin (crashed)"]=$((${runs["$bin (crashed)"]:-0} + 1))
        fi
    done
done

total=0
failed=0
while IFS= read -r t; do
    printf '%-90s %5d runs %4d failed%s\n' "$t" "${runs[$t]}" "${fails[$t]:-0}" \
        "${bad[$t]:+: seeds${bad[$t]}}"
    total=$((total + runs[$t]))
    failed=$((failed + ${fails[$t]:-0}))
done < <(printf '%s\n' "${!runs[@]}" | sort)
echo "many-seeds: ${#runs[@]} tests, $seeds seeds, $total runs, $failed failed ($((SECONDS - start)) s)"
[[ $failed -eq 0 ]]
