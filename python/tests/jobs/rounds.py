"""A worker of test_rounds.py: push_pulls and broadcasts fresh random tensors and saves what
it sent and got to OUT/rank{R}.pt. Usage: rounds.py OUT SEED."""

import os
import sys

import torch

import pushpull.torch as bps
from job_common import onebit_rounds

out, seed = sys.argv[1], int(sys.argv[2])
torch.set_num_threads(1)
bps.init()
r = bps.rank()
gen = torch.Generator().manual_seed(seed * 1000 + r)
# Odd sizes: single elements, chunk boundaries (the test cluster's partition is 32 KiB of fp32:
# 8192 elements), several chunks.
sizes = [1, 7, 1001, 8191, 8193, 3 * 8192 + 5, 100_003]
saved = {"rank": r, "size": bps.size(), "job_seed": bps._w().job_seed}

# Sums and averages, the async in-place form, all in flight at once.
handles, inputs = [], []
for i, n in enumerate(sizes):
    x = torch.randn(n, generator=gen) * 10
    inputs.append(x.clone())
    handles.append(bps.push_pull_async_inplace(x, average=(i % 2 == 1), name=f"t{i}"))
saved["inputs"] = inputs
saved["outputs"] = [bps.synchronize(h) for h in handles]

# A group call, listed in opposite orders on the two ranks (declared first, in one order):
# fresh tensors of interleaved priorities, a float64 one among them, two rounds.
gsizes = [3, 8193, 1, 20_000, 517]
for i, n in enumerate(gsizes):
    bps.declare(f"grp{i}", n, priority=(i % 3) - 1)
saved["group_in"], saved["group_out"] = [], []
order = list(range(len(gsizes))) if r == 0 else list(reversed(range(len(gsizes))))
for _ in range(2):
    xs = [torch.randn(n, generator=gen, dtype=torch.float64 if i == 1 else torch.float32)
          for i, n in enumerate(gsizes)]
    saved["group_in"].append([x.clone() for x in xs])
    got = bps.push_pull_group_inplace([xs[i] for i in order], average=False,
                                      names=[f"grp{i}" for i in order])
    assert all(torch.equal(g, xs[i]) for g, i in zip(got, order)), "results in place, in order"
    saved["group_out"].append([x.clone() for x in xs])

# The copying form, twice on one tensor (two rounds).
y = torch.randn(5000, generator=gen)
saved["copy_in"] = y.clone()
saved["copy_out"] = [bps.push_pull(y, average=False, name="copy"),
                     bps.push_pull(y * 2, average=True, name="copy")]
assert torch.equal(y, saved["copy_in"]), "push_pull must not change its input"

# Converted tensors: float64, a non-contiguous view.
d = torch.randn(333, generator=gen, dtype=torch.float64)
saved["f64_in"] = d.clone()
saved["f64_out"] = bps.push_pull_inplace(d, average=False, name="f64").clone()
m = torch.randn(40, 30, generator=gen)
saved["view_in"] = m.clone()
bps.push_pull_inplace(m.t(), average=False, name="view")
saved["view_out"] = m.clone()

# A compressed tensor, for the comparison with the single-process reference.
onebit_rounds(saved, gen, torch.device("cpu"))

# Broadcasts: a tensor, parameters, an object (random bytes).
b = torch.randn(777, generator=gen)
saved["bcast_in"] = b.clone()
saved["bcast_out"] = bps.broadcast(b, root_rank=1, name="b").clone()
assert torch.equal(b, saved["bcast_in"]), "broadcast is out of place (broadcast_ writes in place)"
model = torch.nn.Sequential(torch.nn.Linear(9, 4), torch.nn.BatchNorm1d(4))
with torch.no_grad():
    for p in model.parameters():
        p.copy_(torch.randn(p.shape, generator=gen))
    model[1].num_batches_tracked.fill_(10 + r)
saved["model_in"] = {k: v.clone() for k, v in model.state_dict().items()}
bps.broadcast_parameters(model.state_dict(), root_rank=0)
saved["model_out"] = {k: v.clone() for k, v in model.state_dict().items()}
blob = bytes(torch.randint(0, 256, (4099,), generator=gen, dtype=torch.uint8).tolist())
saved["object_in"] = {"blob": blob, "rank": r}
saved["object_out"] = bps.broadcast_object(saved["object_in"], root_rank=1)

# Optimizer state: momentum buffers that differ per rank become rank 0's.
lin = torch.nn.Linear(3, 2)
opt = torch.optim.SGD(lin.parameters(), lr=0.1, momentum=0.9)
for p in lin.parameters():
    p.grad = torch.randn(p.shape, generator=gen)
opt.step()
saved["opt_in"] = [v["momentum_buffer"].clone() for v in opt.state_dict()["state"].values()]
bps.broadcast_optimizer_state(opt, root_rank=0)
saved["opt_out"] = [v["momentum_buffer"].clone() for v in opt.state_dict()["state"].values()]

# The GIL is released while a round waits: rank 1 pushes late, and meanwhile a thread of
# rank 0 polls the round (a poll while another thread waits must not deadlock) and notes when
# it ran. Had synchronize held the GIL, no turn would fall inside the wait.
import threading  # noqa: E402
import time  # noqa: E402

# Declaring is a collective (it waits for every worker), so "late" is declared first: the 0.5 s
# falls inside the round, where the call must have released the GIL.
bps.declare("late", 10)
stop = threading.Event()
entered = [None]  # when the main thread called synchronize
during = []  # times of the spinner's turns while the main thread waited (one per ms at most)
if r == 1:
    time.sleep(0.5)
late = torch.ones(10)
h = bps.push_pull_async_inplace(late, name="late")
native = bps._handles[h].native


def spin():
    while not stop.is_set():
        native.poll()
        now = time.monotonic()
        if entered[0] is not None and (not during or now - during[-1] >= 0.001):
            during.append(now)


t = threading.Thread(target=spin)
t.start()
entered[0] = time.monotonic()
bps.synchronize(h)
left = time.monotonic()
stop.set()
t.join()
halves = [0, 0]
for x in during:
    if entered[0] + 0.02 < x < left - 0.02:
        halves[int(2 * (x - entered[0]) >= left - entered[0])] += 1
saved["wait_s"] = left - entered[0]
saved["turns_in_halves"] = halves

saved["metrics"] = bps.metrics()
torch.save(saved, os.path.join(out, f"rank{r}.pt"))
bps.shutdown()
print("done")
