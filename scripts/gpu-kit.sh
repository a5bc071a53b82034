#!/usr/bin/env bash
# Builds the kit that scripts/gpu-check.sh runs on a lent GPU machine, which has the NVIDIA
# driver, python3 with a CUDA torch, torchvision, numpy and pytest, but no Rust and no network
# (DESIGN.md §5): everything compiled is built here and carried there in ./gpu-kit (an ignored
# folder; the `device` tool's `carry`), stripped and xz-packed to stay far below the 64 MiB the
# tree may weigh.
#
# Usage: scripts/gpu-kit.sh            (then, on the GPU machine: scripts/gpu-check.sh STAGES)
#
# What goes in (release builds, the `cuda` feature; the kernels are the PTX shipped with the
# crate, so no NVRTC is needed there):
#   bin/pushpull                 the launcher (`pushpull local`: the benchmark job, the
#                                Python jobs' clusters)
#   bin/kernels-lib              pushpull-kernels' unit tests (shipped_ptx_loads_on_the_gpu)
#   bin/kernels-cuda_gpu         the kernels against the CPU bytes on the GPU
#   bin/kernels-device_batch     device batches against the CPU chains on the GPU
#   bin/worker-device            device buffers through a real cluster (the reference's bits)
#   bin/bench_gpu                kernel and batch throughput against a device-to-device copy
#   bin/bench_compress           the CPU codecs' throughput against memcpy (the servers' and the
#                                host path's speed on that machine's cores)
#   pushpull-*.whl               the Python package (abi3), from python/
# Needs: cargo, and maturin in the test environment (scripts/test.sh makes .venv).
set -euo pipefail
cd "$(dirname "$0")/.."
kit=gpu-kit
venv="${PUSHPULL_VENV:-$PWD/.venv}"
rm -rf "$kit"
mkdir -p "$kit/bin"

echo "== release binaries"
cargo build --release --bin pushpull
cargo build --release -p pushpull-kernels --features cuda --example bench_gpu
cargo build --release -p pushpull-codecs --example bench_compress
target="${CARGO_TARGET_DIR:-$PWD/target}"
cp "$target/release/pushpull" "$target/release/examples/bench_gpu" \
    "$target/release/examples/bench_compress" "$kit/bin/"

echo "== GPU tests (release, --features cuda)"
# The executables cargo builds for these tests, named PACKAGE-TARGET in the kit.
tests() {
    cargo test --release --no-run --message-format=json "$@" |
        python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        pkg = m["package_id"].split("#")[0].rsplit("/", 1)[-1].replace("pushpull-", "")
        name = m["target"]["name"].replace("pushpull_", "")
        print(m["executable"], pkg.split("@")[0] + "-" + ("lib" if m["target"]["kind"] == ["lib"] else name))
'
}
{
    tests -p pushpull-kernels --features cuda --lib --test cuda_gpu --test device_batch
    tests -p pushpull-worker --features cuda --test device
} | while read -r exe name; do cp "$exe" "$kit/bin/$name"; done

echo "== Python wheel (abi3)"
PATH="$venv/bin:$PATH" maturin build --release -m python/Cargo.toml -o "$kit" --quiet

echo "== strip and pack"
strip "$kit"/bin/*
xz -9 -T0 "$kit"/bin/*
ls -l "$kit" "$kit/bin"
du -sh "$kit"
