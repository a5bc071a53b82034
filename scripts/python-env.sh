#!/usr/bin/env bash
# Makes the Python test environment that scripts/test.sh runs python/tests in, if it is not
# there yet: PUSHPULL_VENV (default .venv at the repository root) with torch, numpy, pytest,
# maturin and scikit-learn from PyPI (a few GB, a few minutes). An environment that already
# imports them is left as it is. scripts/test.sh calls it; .ci/run calls it first, before
# anything is built, so that pip's downloads never share the disk with the cargo build.
#
# Usage: scripts/python-env.sh          (prints the environment's folder)
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${PUSHPULL_VENV:-$PWD/.venv}"
if [ ! -x "$venv/bin/python" ]; then
    echo "== making the Python test environment in $venv" >&2
    python3 -m venv "$venv" >&2
fi
if ! "$venv/bin/python" -c "import torch, numpy, pytest, maturin, sklearn" 2>/dev/null; then
    echo "== installing torch, numpy, pytest, maturin and scikit-learn into $venv" >&2
    # pip's output goes to stderr: standard output is the folder's name alone.
    "$venv/bin/pip" install --quiet --upgrade pip >&2
    "$venv/bin/pip" install --quiet torch numpy pytest "maturin>=1.9.4,<2" scikit-learn >&2
fi
echo "$venv"
