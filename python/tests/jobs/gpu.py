"""A worker of test_gpu.py: CUDA tensors through pushpull.torch on the GPU (two workers share
GPU 0), saved with what they were for the test's checks. Usage: gpu.py OUT SEED."""

import os
import sys
import time

import torch

import pushpull.torch as bps
from job_common import onebit_rounds

out, seed = sys.argv[1], int(sys.argv[2])
bps.init()
r = bps.rank()
dev = torch.device("cuda", 0)
gen = torch.Generator().manual_seed(seed * 1000 + r)
saved = {"rank": r, "job_seed": bps._w().job_seed}

# Uncompressed sums and averages of several sizes (chunk boundaries of the test cluster: 8192
# elements), in one group: one batch on the GPU.
sizes = [1, 7, 8191, 8193, 100_003]
xs = [(torch.randn(n, generator=gen) * 10) for n in sizes]
saved["inputs"] = [x.clone() for x in xs]
gpu = [x.to(dev) for x in xs]
got = bps.push_pull_group_inplace(gpu, average=True, names=[f"t{i}" for i in range(len(sizes))])
saved["outputs"] = [g.cpu() for g in got]

# A compressed tensor, three rounds, for the single-process reference.
onebit_rounds(saved, gen, dev)

# float16 on the GPU: widened and narrowed on the device, the host path's bits.
h = torch.randn(3000, generator=gen).to(torch.float16)
saved["f16_in"] = h.clone()
saved["f16_out"] = bps.push_pull_inplace(h.to(dev), average=False, name="f16").cpu()

# The race: the gradient is produced by work queued behind a long sleep on the current stream;
# the round must wait for it, and the result must be there for work queued right after
# synchronize (no torch.cuda.synchronize anywhere in between).
x = torch.zeros(50_000, device=dev)
torch.cuda._sleep(200_000_000)  # ~0.1 s of GPU cycles on the current stream
x.add_(float(r + 1))
hd = bps.push_pull_async_inplace(x, average=False, name="race")
bps.synchronize(hd)
y = x * 1.0  # on the current stream, right after
saved["race_out"] = y.cpu()

# The ordered step: step() queues the optimizer behind the results on the GPU and returns
# without waiting for them. Rank 1 pushes late, so rank 0's results arrive long after its
# step() returned; the parameter read right after step() (queued on the current stream, no
# torch.cuda.synchronize anywhere) must already hold the averaged update: SGD with lr 1 on
# gradients 1 and 2 gives -1.5 a step.
p = torch.nn.Parameter(torch.zeros(20_000, device=dev))
opt = bps.DistributedOptimizer(torch.optim.SGD([p], lr=1.0), [("ordered", p)], ordered_step=True)
after, deferred = [], []
for step in range(3):
    opt.zero_grad()
    if r == 1:
        time.sleep(0.3)
    torch.cuda._sleep(50_000_000)  # the gradient comes late on the GPU too
    (p * float(r + 1)).sum().backward()
    opt.step()
    deferred.append(opt._deferred is not None)
    after.append(p.detach() * 1.0)
    if step == 1:
        # A CUDA round of its own while the step's are outstanding (a loss averaged for the
        # log): its work must not queue the worker's stream behind the waiting stream.
        saved["ordered_between"] = bps.push_pull(torch.ones(3, device=dev), name="between").cpu()
saved["ordered_after"] = [a.cpu() for a in after]
saved["ordered_deferred"] = deferred

# Bad input: a non-contiguous CUDA tensor is refused by name, and the job goes on.
m = torch.randn(40, 30, device=dev)
try:
    bps.push_pull_inplace(m.t(), name="view")
    saved["noncontiguous"] = None
except ValueError as e:
    saved["noncontiguous"] = str(e)

saved["metrics"] = bps.metrics()
torch.save(saved, os.path.join(out, f"rank{r}.pt"))
bps.shutdown()
print("done")
