"""A job for test_gossip.py: decentralised SGD through pushpull.torch.DecentralizedOptimizer
on a ring of 4. Each rank starts from its own parameters (rank 0's are broadcast at
construction), takes STEPS steps of plain SGD with lr 1 (x ← x − g, exact in float32) on
gradients drawn from (seed, step, rank), and saves its parameters after each step, and the
mean model at the end, to OUT/MODE-RANK.pt. MODE is the message codec: `dpsgd` (full
precision), `moniqua` (2 bits), `moniqua-lr` (the same with θ read from the learning rate) or
`moniqua-bound` (θ from the learning rate and each rank's largest gradient so far)."""

import sys
from pathlib import Path

import torch

import pushpull.torch as bps

STEPS = 4
SHAPES = {"w": (300, 40), "b": (40,)}
MAPS = {
    "dpsgd": {},
    "moniqua": {"compressor": "moniqua", "theta": "0.5", "bits": "2"},
    # θ = 0.5 × the group's learning rate (1): the same bound as `moniqua`.
    "moniqua-lr": {"compressor": "moniqua", "theta": "0.5", "bits": "2", "theta_schedule": "lr"},
    # θ = the paper's Theorem 2 bound 2·lr·G·ln(16n)/(1 − ρ) from each rank's own gradients.
    "moniqua-bound": {"compressor": "moniqua", "theta": "1", "bits": "2",
                      "theta_schedule": "bound"},
}


def main(mode: str, out: Path, seed: int) -> None:
    bps.init()
    rank = bps.rank()
    gen = torch.Generator().manual_seed(seed * 7 + rank)
    params = {n: torch.nn.Parameter(torch.randn(s, generator=gen)) for n, s in SHAPES.items()}
    sgd = torch.optim.SGD(params.values(), lr=1.0)
    opt = bps.DecentralizedOptimizer(sgd, params.items(), compression_params=MAPS[mode])
    saved = {"initial": {n: p.detach().clone() for n, p in params.items()}, "steps": [],
             "grads": []}
    for step in range(STEPS):
        g = torch.Generator().manual_seed(seed * 1_000_003 + step * 1009 + rank)
        grads = {n: 0.01 * torch.randn(p.shape, generator=g) for n, p in params.items()}
        for n, p in params.items():
            p.grad = grads[n].clone()
        opt.step()
        saved["grads"].append(grads)
        saved["steps"].append({n: p.detach().clone() for n, p in params.items()})
    saved["mean"] = opt.mean_model()
    torch.save(saved, out / f"{mode}-{rank}.pt")
    bps.shutdown()


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]))
