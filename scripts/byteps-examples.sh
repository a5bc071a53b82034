#!/usr/bin/env bash
# BytePS's own PyTorch examples that need no data download, run through pushpull with their
# import changed (`byteps.torch` -> `pushpull.torch`) on a local cluster of 2 workers, on the
# CPU with a small model. The scripts are fetched from BytePS's repository at a fixed commit
# (not copied into this one). Their profiler call uses an argument today's torch removed
# (`use_cuda`); that line is adjusted too, as it would be for BytePS itself.
#
#   scripts/byteps-examples.sh [PYTHON]      # default: .venv/bin/python (torch, torchvision)
#   PUSHPULL_BYTEPS_SRC=~/src/byteps scripts/byteps-examples.sh   # from a checkout instead of GitHub
#
# Needs GitHub (or PUSHPULL_BYTEPS_SRC) and `pushpull` built (`cargo build --bins`).
set -euo pipefail
cd "$(dirname "$0")/.."
python=${1:-$PWD/.venv/bin/python}
commit=${PUSHPULL_BYTEPS_COMMIT:-master}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
export PATH="$PWD/target/debug:$PATH"
for script in benchmark_byteps.py benchmark_byteps_ddp.py; do
    if [ -n "${PUSHPULL_BYTEPS_SRC:-}" ]; then
        cp "$PUSHPULL_BYTEPS_SRC/example/pytorch/$script" "$dir/$script"
    else
        curl -fsSL "https://raw.githubusercontent.com/bytedance/byteps/$commit/example/pytorch/$script" \
            -o "$dir/$script"
    fi
    sed -i -e 's/byteps\.torch/pushpull.torch/g' \
        -e 's/, use_cuda=True//' -e 's/profile(enable_profiling, True)/profile(enable_profiling)/' \
        "$dir/$script"
    echo "== $script (import changed to pushpull.torch)"
    pushpull local --workers 2 -- "$python" "$dir/$script" --no-cuda --model resnet18 \
        --batch-size 8 --num-warmup-batches 1 --num-batches-per-iter 2 --num-iters 2
done
