"""A worker of the fusion tests (test_optimizer.py on the CPU, test_gpu.py on CUDA): the same
random gradients of a small MLP on DEVICE averaged by two DistributedOptimizers, one fusing its
small gradients (the default) and one keeping them apart; saves both results, its own
gradients and the tensors the worker declared. Usage: fusion.py OUT SEED DEVICE"""

import sys
from pathlib import Path

import torch

import pushpull.torch as bps

out, seed, device = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
bps.init()
rank = bps.rank()
torch.manual_seed(seed)
# With small.toml (min_compress_bytes = 4096) the biases are small, the weights are not.
model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
model = model.to(device)
g = torch.Generator().manual_seed(seed * 31 + rank)
grads = {n: torch.randn(p.shape, generator=g) for n, p in model.named_parameters()}
results = {}
for tag, fuse in (("fused", True), ("apart", False)):
    opt = bps.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1),
        named_parameters=[(f"{tag}.{n}", p) for n, p in model.named_parameters()],
        fuse_small=fuse,
    )
    for n, p in model.named_parameters():
        p.grad = grads[n].to(device)
    opt.synchronize()
    results[tag] = {n: p.grad.cpu() for n, p in model.named_parameters()}
torch.save(
    {"grads": grads, "results": results, "tensors": sorted(bps.metrics()["tensors"])},
    out / f"rank{rank}.pt",
)
bps.shutdown()
