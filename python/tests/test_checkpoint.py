"""pushpull.torch.save_state / load_state: a job of 2 workers stopped after K rounds with a
checkpoint and restarted from it (a fresh `pushpull local`, so fresh servers) gives rounds
K..2K bit for bit as a job that never stopped, though the step before the checkpoint was
skipped (its rounds discarded); the stateful tensors are onebit with error feedback, top-k with
momentum and dithering (stochastic) with corrected error feedback. A damaged checkpoint raises
PushPullError naming the damage.

With CUDA tensors (on a GPU only; skipped without one, failing under PUSHPULL_REQUIRE_GPU=1 as
test_gpu.py does) onebit's and dithering's state lives on the GPU and top-k's on the host: the
restart is bit for bit too, and every round gives the host job's bits."""

import os
from pathlib import Path

import pytest
import torch

from conftest import run_job, same_bits

SMALL = Path(__file__).resolve().parent / "small.toml"


def results(out: Path, mode: str):
    return [torch.load(out / f"{mode}-{r}.pt", weights_only=False) for r in range(2)]


def run_modes(pushpull, seed, out: Path, device: str, modes):
    out.mkdir(exist_ok=True)
    for mode in modes:
        p = run_job(pushpull, "checkpoint.py", mode, out, seed, device, config=SMALL)
        assert p.returncode == 0, f"{mode} on {device}: {p.stderr}"
    return [results(out, m) for m in modes]


def check_restart(stop, restart, whole):
    """Rounds 0..K of the stopped job and K..2K of the restarted one equal the whole job's."""
    k = len(stop[0]["results"])
    for r in range(2):
        assert len(whole[r]["results"]) == 2 * k
        for step, (a, b) in enumerate(zip(stop[r]["results"], whole[r]["results"][:k])):
            for i, (x, y) in enumerate(zip(a, b)):
                assert same_bits(x.numpy(), y.numpy()), f"rank {r} round {step} tensor {i}"
        for step, (a, b) in enumerate(zip(restart[r]["results"], whole[r]["results"][k:])):
            for i, (x, y) in enumerate(zip(a, b)):
                assert same_bits(x.numpy(), y.numpy()), f"rank {r} round {k + step} tensor {i}"


def test_a_restarted_job_continues_bit_for_bit(pushpull, seed, tmp_path):
    stop, restart, whole = run_modes(pushpull, seed, tmp_path, "cpu", ["stop", "restart", "whole"])
    check_restart(stop, restart, whole)
    # A damaged checkpoint is refused by name.
    good = (tmp_path / "ckpt-0.bin").read_bytes()
    (tmp_path / "ckpt-0.bin").write_bytes(good[: len(good) // 2])
    (tmp_path / "ckpt-1.bin").write_bytes(good[:-3] + bytes([good[-3] ^ 1]) + good[-2:])
    p = run_job(pushpull, "checkpoint.py", "restart", tmp_path, seed, config=SMALL)
    assert p.returncode != 0
    assert "ckpt-0.bin: truncated" in p.stdout + p.stderr or "ckpt-1.bin: corrupted" in p.stdout + p.stderr, p.stderr


def test_state_on_the_gpu_restarts_bit_for_bit(pushpull, seed, tmp_path):
    if not torch.cuda.is_available():
        if os.environ.get("PUSHPULL_REQUIRE_GPU") == "1":
            raise RuntimeError("PUSHPULL_REQUIRE_GPU=1, but torch sees no CUDA GPU")
        pytest.skip("no CUDA GPU (torch.cuda.is_available() is False)")
    stop, restart, whole = run_modes(
        pushpull, seed, tmp_path / "cuda", "cuda", ["stop", "restart", "whole"]
    )
    for r in range(2):
        where = whole[r]["where"]
        assert where == {"onebit": "cuda:0", "topk": "cpu", "dithering": "cuda:0"}, where
    check_restart(stop, restart, whole)
    (host,) = run_modes(pushpull, seed, tmp_path / "cpu", "cpu", ["whole"])
    for r in range(2):
        for step, (a, b) in enumerate(zip(whole[r]["results"], host[r]["results"])):
            for i, (x, y) in enumerate(zip(a, b)):
                assert same_bits(x.numpy(), y.numpy()), f"rank {r} round {step} tensor {i}: GPU vs host"
