#!/usr/bin/env bash
# Regenerates kernels/cuda/pushpull_kernels.ptx, the PTX shipped with pushpull-kernels (what a
# GPU loads, so that users need no NVRTC): run it after changing kernels/cuda/pushpull_elem.cuh,
# pushpull_work.cuh, pushpull_table.cuh or pushpull_kernels.cu, and commit the .ptx with the change. The test
# `shipped_ptx_is_fresh` (kernels/tests/nvrtc_compile.rs, run by CI with NVRTC 12.4) fails
# until you do.
#
# Usage: scripts/ptx.sh        (from any directory; no GPU needed)
#
# How: `.ci/nvrtc.sh` installs NVRTC 12.4.127 from PyPI into .venv-nvrtc (once; needs python3
# and pip access) and puts it on LD_LIBRARY_PATH; NVRTC 12.4 because its PTX (ISA 8.4, for
# compute_70) loads on every CUDA 12.4+ driver, CUDA 13 included, while NVRTC 13 cannot target
# compute_70. Then `shipped_ptx_is_fresh` runs with PUSHPULL_WRITE_PTX=1, which compiles
# `cuda::SOURCE` for compute_70 with `cuda::NVRTC_OPTIONS` (`cuda::compile_shipped_ptx`) and
# writes the file when it differs; the test then runs again, normally, to check the result.
# Cargo settings such as CARGO_TARGET_DIR are passed through.
set -euo pipefail
cd "$(dirname "$0")/.."

# shellcheck source=../.ci/nvrtc.sh
source .ci/nvrtc.sh

test_args=(-p pushpull-kernels --test nvrtc_compile -- --exact shipped_ptx_is_fresh --nocapture)
PUSHPULL_WRITE_PTX=1 cargo test "${test_args[@]}"
cargo test "${test_args[@]}"
echo "ptx.sh: kernels/cuda/pushpull_kernels.ptx: $(wc -c <kernels/cuda/pushpull_kernels.ptx) bytes"
