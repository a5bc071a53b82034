"""A worker of test_optimizer.py's two-model test: three models whose parameters have the same
names (A and C of one shape, B of another, as a GAN's generator and discriminator may), each
with its own DistributedOptimizer and onebit with error feedback, run two steps; then three
fresh copies whose names are made distinct by hand run the same steps. Saves both runs'
averaged gradients and the tensors the worker declared. Usage: two_models.py OUT SEED"""

import sys
from pathlib import Path

import torch

import pushpull.torch as bps

out, seed = Path(sys.argv[1]), int(sys.argv[2])
bps.init()
rank = bps.rank()
ONEBIT = {"compressor": "onebit", "scaling": "true", "ef": "vanilla"}


def models():
    torch.manual_seed(seed)
    mlp = lambda hidden: torch.nn.Sequential(  # noqa: E731
        torch.nn.Linear(64, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 10))
    return {"a": mlp(128), "b": mlp(32), "c": mlp(128)}


g = torch.Generator().manual_seed(seed * 31 + rank)
shapes = {m: [p.shape for p in model.parameters()] for m, model in models().items()}
grads = [{m: [torch.randn(s, generator=g) for s in shapes[m]] for m in shapes} for _ in range(2)]
results = {}
for run in ("same names", "distinct names"):
    ms = models()
    opts = {
        m: bps.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.1),
            named_parameters=[
                (n if run == "same names" else f"{m}.{n}", p) for n, p in model.named_parameters()
            ],
            compression_params=ONEBIT,
        )
        for m, model in ms.items()
    }
    results[run] = []
    for step in range(2):
        for m in ("a", "c", "b"):
            for p, grad in zip(ms[m].parameters(), grads[step][m]):
                p.grad = grad.clone()
            opts[m].synchronize()
            results[run].append([p.grad.clone() for p in ms[m].parameters()])
torch.save({"results": results, "tensors": sorted(bps.metrics()["tensors"])}, out / f"rank{rank}.pt")
bps.shutdown()
