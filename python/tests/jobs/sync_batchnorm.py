"""A worker of test_sync_batchnorm.py: pushpull.torch.SyncBatchNorm (Horovod's) on this rank's
half of a fixed batch, forward and backward, two training steps then one in eval; saved to
OUT/rank{R}.pt. Usage: sync_batchnorm.py OUT SEED."""

import os
import sys

import torch

import pushpull.torch as hvd

out, seed = sys.argv[1], int(sys.argv[2])
torch.set_num_threads(1)
hvd.init()
r, n = hvd.rank(), hvd.size()
torch.manual_seed(seed)
x = torch.randn(2 * n, 6, 5, generator=torch.Generator().manual_seed(seed)) * 3 + 1
bn = hvd.SyncBatchNorm(6)
with torch.no_grad():
    bn.weight.copy_(torch.linspace(0.5, 2.0, 6))
    bn.bias.copy_(torch.linspace(-1.0, 1.0, 6))
saved = {"rank": r, "size": n}
for step in range(2):
    mine = x[2 * r:2 * r + 2].clone().requires_grad_(True)
    y = bn(mine)
    (y * torch.arange(y.numel()).view_as(y).float().sin()).sum().backward()
    saved[f"y{step}"] = y.detach()
    saved[f"dx{step}"] = mine.grad
saved["dw"], saved["db"] = bn.weight.grad.clone(), bn.bias.grad.clone()
saved["running"] = (bn.running_mean.clone(), bn.running_var.clone())
bn.eval()
saved["eval"] = bn(x[2 * r:2 * r + 2]).detach()
torch.save(saved, os.path.join(out, f"rank{r}.pt"))
hvd.shutdown()
print("done")
