#!/usr/bin/env bash
# The whole test suite, as README.md says and CI runs: every Rust test of the workspace, then
# the Python package's tests (python/tests) in a virtual environment of their own.
#
# The environment is PUSHPULL_VENV (default .venv at the repository root); scripts/python-env.sh
# makes it on the first run (torch, numpy, pytest, maturin, scikit-learn from PyPI: a few GB, a
# few minutes) and it is reused after. The package is rebuilt into it from ./python on every
# run, sharing the cargo target folder with the Rust tests.
set -euo pipefail
cd "$(dirname "$0")/.."

cargo test --workspace

venv="$(scripts/python-env.sh)"
echo "== building the pushpull Python package into $venv"
# The dev profile (optimised dependencies) shares what `cargo test` just built; maturin is
# taken from the environment (no build isolation, so no second download).
PATH="$venv/bin:$PATH" MATURIN_PEP517_ARGS="--profile dev" \
    "$venv/bin/pip" install --quiet --no-build-isolation --force-reinstall --no-deps ./python
echo "== Python tests"
# The launcher the tests start: the binary `cargo test` built.
PUSHPULL_BIN="${CARGO_TARGET_DIR:-$PWD/target}/debug/pushpull" \
    "$venv/bin/python" -m pytest python/tests -q
