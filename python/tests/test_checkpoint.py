"""pushpull.torch.save_state / load_state: a job of 2 workers stopped after K rounds with a
checkpoint and restarted from it (a fresh `pushpull local`, so fresh servers) gives rounds
K..2K bit for bit as a job that never stopped; the stateful tensors are onebit with error
feedback, top-k with momentum and dithering (stochastic) with corrected error feedback. A
damaged checkpoint raises PushPullError naming the damage."""

from pathlib import Path

import torch

from conftest import run_job, same_bits

SMALL = Path(__file__).resolve().parent / "small.toml"


def results(out: Path, mode: str):
    return [torch.load(out / f"{mode}-{r}.pt", weights_only=False) for r in range(2)]


def test_a_restarted_job_continues_bit_for_bit(pushpull, seed, tmp_path):
    for mode in ["stop", "restart", "whole"]:
        p = run_job(pushpull, "checkpoint.py", mode, tmp_path, seed, config=SMALL)
        assert p.returncode == 0, f"{mode}: {p.stderr}"
    stop, restart, whole = (results(tmp_path, m) for m in ["stop", "restart", "whole"])
    k = len(stop[0]["results"])
    for r in range(2):
        assert len(whole[r]["results"]) == 2 * k
        for step, (a, b) in enumerate(zip(stop[r]["results"], whole[r]["results"][:k])):
            for i, (x, y) in enumerate(zip(a, b)):
                assert same_bits(x.numpy(), y.numpy()), f"rank {r} round {step} tensor {i}"
        for step, (a, b) in enumerate(zip(restart[r]["results"], whole[r]["results"][k:])):
            for i, (x, y) in enumerate(zip(a, b)):
                assert same_bits(x.numpy(), y.numpy()), f"rank {r} round {k + step} tensor {i}"
    # A damaged checkpoint is refused by name.
    good = (tmp_path / "ckpt-0.bin").read_bytes()
    (tmp_path / "ckpt-0.bin").write_bytes(good[: len(good) // 2])
    (tmp_path / "ckpt-1.bin").write_bytes(good[:-3] + bytes([good[-3] ^ 1]) + good[-2:])
    p = run_job(pushpull, "checkpoint.py", "restart", tmp_path, seed, config=SMALL)
    assert p.returncode != 0
    assert "ckpt-0.bin: truncated" in p.stdout + p.stderr or "ckpt-1.bin: corrupted" in p.stdout + p.stderr, p.stderr
