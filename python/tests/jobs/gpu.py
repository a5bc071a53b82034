"""A worker of test_gpu.py: CUDA tensors through pushpull.torch on the GPU (two workers share
GPU 0), saved with what they were for the test's checks. Usage: gpu.py OUT SEED."""

import os
import sys

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
