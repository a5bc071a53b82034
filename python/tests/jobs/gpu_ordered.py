"""A worker of test_gpu.py's ordered-step checks: DistributedOptimizer(ordered_step=True) on
GPU 0, rank 1 pushing late, so that rank 0's step() returns long before its results arrive.
Each step's parameter is read right after step() (a copy queued on the current stream, no
torch.cuda.synchronize in between). Right after the second step, a CUDA round of another
tensor (which must not queue the worker's stream behind the waiting one); right after the
others, rank 0 frees GPU memory (torch.cuda.empty_cache, a 1 GiB allocation: a synchronous
free waits for the whole GPU) while its stream waits. Under CUDA_DEVICE_MAX_CONNECTIONS below
8 the steps wait on the CPU. Saves each step's parameter, whether the step left its outcomes
for later, and the other round's result. Usage: gpu_ordered.py OUT."""

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
saved = {"after": [], "deferred": []}
for step in range(3):
    opt.zero_grad()
    if r == 1:
        time.sleep(0.5)
    torch.cuda._sleep(50_000_000)  # the gradient comes late on the GPU too
    (p * float(r + 1)).sum().backward()
    opt.step()
    saved["deferred"].append(opt._deferred is not None)
    # While rank 0's stream waits for the step's results (rank 1 pushes 0.5 s late):
    if step == 1:
        saved["between"] = bps.push_pull(torch.ones(3, device=dev), name="between").cpu()
    elif r == 0:
        torch.cuda.empty_cache()
        big = torch.empty(2**28, device=dev)
        del big
        torch.cuda.empty_cache()
    saved["after"].append(p.detach().cpu())
torch.save(saved, os.path.join(out, f"rank{r}.pt"))
bps.shutdown()
print("done")
