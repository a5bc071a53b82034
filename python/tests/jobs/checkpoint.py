"""A job for test_checkpoint.py: MODE is `stop` (rounds 0..K, then save_state), `restart`
(load_state, then rounds K..2K) or `whole` (rounds 0..2K); each rank saves its results by
round to OUT/MODE-RANK.pt. DEVICE (default `cpu`) is where the gradients live: `cuda` hands
CUDA tensors in, so onebit and dithering keep their state on the GPU (top-k, which has no
kernel, on the host). The tensors carry state: onebit with error feedback, top-k with
momentum, and dithering (stochastic) with corrected error feedback and a learning rate that
changes every step. Step K-1 is skipped, as a loss scaler skips one: its rounds are discarded
before the checkpoint (and at the same point of the whole job)."""

import sys
from pathlib import Path

import torch

import pushpull.torch as bps

K = 3
TENSORS = {
    "onebit": (6_000, {"compressor": "onebit", "ef": "vanilla"}),
    "topk": (5_000, {"compressor": "topk", "k": "0.05", "ef": "vanilla", "momentum": "nesterov"}),
    "dithering": (4_000, {"compressor": "dithering", "k": "7", "ef": "corrected"}),
}


def gradient(seed: int, step: int, rank: int, i: int, n: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed * 1_000_003 + step * 1009 + rank * 31 + i)
    return torch.randn(n, generator=gen)


def main(mode: str, out: Path, seed: int, device: str) -> None:
    bps.init()
    rank = bps.rank()
    for name, (n, params) in TENSORS.items():
        bps.declare(name, torch.zeros(n), params)
    # As a training script does at start: its tensors carry no compressor state, so loading
    # after it keeps them as they are.
    params = {"w": torch.full((10,), float(rank))}
    bps.broadcast_parameters(params, root_rank=0)
    assert torch.equal(params["w"], torch.zeros(10))
    first, last = {"stop": (0, K), "restart": (K, 2 * K), "whole": (0, 2 * K)}[mode]
    if mode == "restart":
        bps.load_state(out / f"ckpt-{rank}.bin")
    results = []
    for step in range(first, last):
        bps._w().set_learning_rate(0.1 / (1 + step % 4))
        gs = [gradient(seed, step, rank, i, n).to(device) for i, (n, _) in enumerate(TENSORS.values())]
        got = bps.push_pull_group_inplace(gs, average=True, names=list(TENSORS))
        results.append([g.cpu() for g in got])
        if step == K - 1:
            bps.discard_last_round(list(TENSORS))
    if mode == "stop":
        bps.save_state(out / f"ckpt-{rank}.bin")
    where = {name: m["device"] for name, m in bps.metrics()["tensors"].items() if name in TENSORS}
    torch.save({"rank": rank, "job_seed": bps._w().job_seed, "results": results, "where": where},
               out / f"{mode}-{rank}.pt")
    bps.shutdown()


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), sys.argv[4] if len(sys.argv) > 4 else "cpu")
