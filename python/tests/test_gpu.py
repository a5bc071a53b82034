"""CUDA tensors through pushpull.torch on a real GPU: two workers sharing GPU 0 give the host
path's bits (a float32 rank-order sum, the Rust single-process reference with a compressor
through a round that overflows on one worker and is discarded, float16 narrowed back); the
round waits for the stream that produced the gradient, and the result is there for work
queued right after synchronize; a non-contiguous CUDA tensor is refused by name;
DistributedOptimizer's fused small gradients get the unfused bits; after an ordered step()
(``ordered_step``) the parameter read at once holds the average, also with another CUDA round
between two steps and the host freeing GPU memory while the stream waits, and under
CUDA_DEVICE_MAX_CONNECTIONS=1 the step waits on the CPU.

Skipped without a CUDA GPU; with PUSHPULL_REQUIRE_GPU=1 (the GPU machine's check script) a
missing GPU fails instead."""

import os
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import (
    assert_onebit_matches_the_reference, check_fusion_job, rank_order_sum, run_job, same_bits,
)

SMALL = Path(__file__).resolve().parent / "small.toml"

if not torch.cuda.is_available():
    if os.environ.get("PUSHPULL_REQUIRE_GPU") == "1":
        raise RuntimeError("PUSHPULL_REQUIRE_GPU=1, but torch sees no CUDA GPU")
    pytest.skip("no CUDA GPU (torch.cuda.is_available() is False)", allow_module_level=True)


def test_fused_small_gradients_on_the_gpu_give_the_unfused_bits(pushpull, seed, tmp_path):
    """DistributedOptimizer's fusion on CUDA gradients: packed and unpacked on the GPU, the
    float32 rank-order average's bits for every gradient, fused or not."""
    p = run_job(pushpull, "fusion.py", tmp_path, seed, "cuda", config=SMALL, timeout=300)
    assert p.returncode == 0, p.stderr
    check_fusion_job(tmp_path)


def test_cuda_tensors_on_the_gpu_give_the_host_bits(pushpull, seed, tmp_path):
    p = run_job(pushpull, "gpu.py", tmp_path, seed, config=SMALL, timeout=300)
    assert p.returncode == 0, p.stderr
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(2)]

    for i, _ in enumerate(ranks[0]["inputs"]):
        want = rank_order_sum([s["inputs"][i].numpy() for s in ranks]) / np.float32(2)
        for s in ranks:
            assert same_bits(s["outputs"][i].numpy(), want), f"tensor t{i}, rank {s['rank']}"

    assert_onebit_matches_the_reference(ranks, SMALL)

    f16 = rank_order_sum([s["f16_in"].float().numpy() for s in ranks])
    want16 = torch.from_numpy(f16).to(torch.float16)
    for s in ranks:
        assert torch.equal(s["f16_out"], want16), "float16 narrowed back as the host path does"

    for s in ranks:
        assert torch.equal(s["race_out"], torch.full((50_000,), 3.0)), "the round raced its stream"
        assert "non-contiguous" in (s["noncontiguous"] or ""), s["noncontiguous"]
        m = s["metrics"]
        for name in ["t0", "t4", "onebit", "f16", "race"]:
            assert m["tensors"][name]["device"] == "cuda:0", (name, m["tensors"][name])
        assert m["driver_calls"] > 0 and m["device_bytes"] > 0, m


@pytest.mark.parametrize("connections", [None, "1"])
def test_an_ordered_step_orders_the_optimizer_after_the_results(
    pushpull, tmp_path, monkeypatch, connections
):
    """jobs/gpu_ordered.py: SGD with lr 1 on gradients 1 and 2 gives -1.5 a step; each
    step's parameter, read right after step() while the peer pushes 0.5 s late, must already
    hold it (a hang, e.g. a free while the stream waits, fails by the timeout); with
    CUDA_DEVICE_MAX_CONNECTIONS=1 the steps wait on the CPU instead."""
    if connections is not None:
        monkeypatch.setenv("CUDA_DEVICE_MAX_CONNECTIONS", connections)
    p = run_job(pushpull, "gpu_ordered.py", tmp_path, config=SMALL, timeout=90)
    assert p.returncode == 0, p.stderr
    for r in range(2):
        s = torch.load(tmp_path / f"rank{r}.pt", weights_only=False)
        for i, a in enumerate(s["after"]):
            assert torch.equal(a, torch.full((100_000,), -1.5 * (i + 1))), f"rank {r}, step {i}"
        assert s["deferred"] == [connections is None] * 3, s["deferred"]
        assert torch.equal(s["between"], torch.ones(3)), s["between"]
