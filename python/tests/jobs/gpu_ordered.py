"""A worker of test_gpu.py's ordered-step checks: DistributedOptimizer(ordered_step=True) on
GPU 0 while the host frees GPU memory (torch.cuda.empty_cache and a 1 GiB allocation) right
after step(), with rank 1 pushing late so that the current stream is still waiting for the
results; and what a step does under CUDA_DEVICE_MAX_CONNECTIONS (it waits on the CPU below 8).
Saves each step's parameter and whether the step left its outcomes for later. Usage:
gpu_ordered.py OUT."""

import os
import sys
import time

import torch

import pushpull.torch as bps

out = sys.argv[1]
bps.init()
r = bps.rank()
dev = torch.device("cuda", 0)
p = torch.nn.Parameter(torch.zeros(100_000, device=dev))
opt = bps.DistributedOptimizer(torch.optim.SGD([p], lr=1.0), [("ordered", p)], ordered_step=True)
after, deferred = [], []
for step in range(3):
    opt.zero_grad()
    if r == 1:
        time.sleep(0.5)
    (p * float(r + 1)).sum().backward()
    opt.step()
    deferred.append(opt._deferred is not None)
    if r == 0:
        # A synchronous free while the stream waits for the results (cudaFree waits for the
        # whole GPU): the worker must still be able to queue the decodes that release it.
        torch.cuda.empty_cache()
        big = torch.empty(2**28, device=dev)
        del big
        torch.cuda.empty_cache()
    after.append(p.detach().cpu())
torch.save({"after": after, "deferred": deferred}, os.path.join(out, f"rank{r}.pt"))
bps.shutdown()
print("done")
