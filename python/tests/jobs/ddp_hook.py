"""A worker of test_ddp_hook.py: torch's own DistributedDataParallel (gloo for its setup) with
pushpull.torch.push_pull_hook, on fresh random data, saved to OUT/rank{R}.pt. Usage:
ddp_hook.py OUT SEED.

* "plain" and "hooked": the same model, initialisation and batches, trained side by side,
  one with DDP's own all-reduce and one with the hook uncompressed; their parameters after
  every step.
* "onebit": the same model with the hook, onebit and error feedback, on a fixed dataset per
  rank; its losses, its uncompressed twin's parameters, and every bucket round's input and
  output by tensor name (a recording hook around push_pull_hook), for the Rust reference.
* "powersgd": the same with PowerSGD, every bucket round's input, output and gradient shapes.
* "late": the hook called on a bucket-like object (declared by a first round) while rank 1
  is 1 s late: it returns at once, its future not done, then done with the average.
"""

import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import pushpull.torch as bps

out, seed = sys.argv[1], int(sys.argv[2])
torch.set_num_threads(1)
bps.init()
r, n = bps.rank(), bps.size()
dist.init_process_group("gloo", init_method=f"file://{os.path.join(out, 'gloo')}", rank=r,
                        world_size=n)
gen = torch.Generator().manual_seed(seed * 1000 + r)
saved = {"rank": r, "size": n, "job_seed": bps._w().job_seed}
STEPS, ONEBIT_STEPS = 4, 15
BUCKET_MB = 0.01  # ~2600 float32 per bucket: several buckets once DDP rebuilds them


def make_model():
    torch.manual_seed(seed)  # the same initial parameters in every model and on every rank
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64),
                               torch.nn.ReLU(), torch.nn.Linear(64, 10))


def params(model):
    return {k: v.detach().clone() for k, v in model.module.named_parameters()}


def step(model, opt, x, y):
    opt.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    return float(loss.detach())


# 1. DDP's own all-reduce against the hook, uncompressed, on the same batches.
plain = DDP(make_model(), bucket_cap_mb=BUCKET_MB)
hooked = DDP(make_model(), bucket_cap_mb=BUCKET_MB)
hooked_state = bps.PushPullHookState()
hooked.register_comm_hook(hooked_state, bps.push_pull_hook)
opt_p = torch.optim.SGD(plain.parameters(), lr=0.1)
opt_h = torch.optim.SGD(hooked.parameters(), lr=0.1)
saved["plain"], saved["hooked"] = [], []
for _ in range(STEPS):
    x, y = torch.randn(16, 32, generator=gen), torch.randint(0, 10, (16,), generator=gen)
    step(plain, opt_p, x, y)
    step(hooked, opt_h, x, y)
    saved["plain"].append(params(plain))
    saved["hooked"].append(params(hooked))
saved["hooked_names"] = list(hooked_state.bucket_names)

# 2. onebit with error feedback, on a fixed dataset per rank (labels from a random teacher),
# beside its uncompressed twin; every bucket round recorded.
teacher = torch.randn(32, 10, generator=torch.Generator().manual_seed(seed))
data_x = torch.randn(64, 32, generator=gen)
data_y = (data_x @ teacher).argmax(dim=1)
ONEBIT = {"compressor": "onebit", "ef": "vanilla", "scaling": "true"}
onebit_state = bps.PushPullHookState(params=ONEBIT, prefix="onebit")
rounds = []  # (name, input, output) in the order they started


def recording_hook(state, bucket):
    name, x = state.name_of(bucket), bucket.buffer().clone()
    fut = bps.push_pull_hook(state, bucket)

    def record(f):
        rounds.append((name, x, f.value().clone()))
        return f.value()

    return fut.then(record)


onebit = DDP(make_model(), bucket_cap_mb=BUCKET_MB)
onebit.register_comm_hook(onebit_state, recording_hook)
twin = DDP(make_model(), bucket_cap_mb=BUCKET_MB)
twin.register_comm_hook(bps.PushPullHookState(prefix="twin"), bps.push_pull_hook)
opt_o = torch.optim.SGD(onebit.parameters(), lr=0.5)
opt_t = torch.optim.SGD(twin.parameters(), lr=0.5)
saved["onebit_loss"] = []
for _ in range(ONEBIT_STEPS):
    saved["onebit_loss"].append(step(onebit, opt_o, data_x, data_y))
    step(twin, opt_t, data_x, data_y)
with torch.no_grad():
    saved["onebit_final_loss"] = float(torch.nn.functional.cross_entropy(onebit(data_x), data_y))
saved["onebit_params"], saved["twin_params"] = params(onebit), params(twin)
saved["onebit_names"] = list(onebit_state.bucket_names)
saved["onebit_rounds"] = rounds
saved["onebit_map"] = ONEBIT


# 3. The hook does not wait for the round: rank 1 starts it a second later.
class Bucket:
    """What push_pull_hook reads of a dist.GradBucket."""

    def __init__(self, buffer):
        self._buffer = buffer

    def index(self):
        return 0

    def buffer(self):
        return self._buffer

    def parameters(self):
        return [self._buffer]


late_state = bps.PushPullHookState(prefix="late")
# The first round declares the bucket's tensor: a collective, which waits for every worker.
bps.push_pull_hook(late_state, Bucket(torch.zeros(3000))).wait()
late = torch.randn(3000, generator=gen)
saved["late_in"] = late.clone()
if r == 1:
    time.sleep(1.0)
t0 = time.monotonic()
fut = bps.push_pull_hook(late_state, Bucket(late))
saved["late_call_s"] = time.monotonic() - t0
saved["late_done_at_return"] = fut.done()
saved["late_out"] = fut.wait().clone()

# 4. torch's hooks take a process group as their state: the world group stands for the
# default (uncompressed) state.
world = torch.randn(500, generator=gen)
saved["world_in"] = world.clone()
saved["world_out"] = bps.push_pull_hook(dist.group.WORLD, Bucket(world)).wait().clone()

# 5. torch's fp16 wrapper around pushpull's hook: the bucket travels as fp16.
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import fp16_compress_wrapper

half_state = bps.PushPullHookState(prefix="half")
half = torch.randn(2000, generator=gen)
saved["half_in"] = half.clone()


class HalfBucket(Bucket):
    """A bucket torch's wrapper can re-point at its float16 copy."""

    def set_buffer(self, buffer):
        self._buffer = buffer


saved["half_out"] = fp16_compress_wrapper(bps.push_pull_hook)(half_state, HalfBucket(half)).wait()
saved["half_names"] = list(half_state.bucket_names)

# 6. A step whose result is not finite (rank 0's bucket 1 overflowed) is discarded at the
# next step: onebit with error feedback (deterministic, so the state's prefix does not matter)
# then gives the second step bit for bit what a state that never ran the first gives, and a
# state whose first step was finite gives something else.
class IndexedBucket(Bucket):
    def __init__(self, buffer, index):
        super().__init__(buffer)
        self._index = index

    def index(self):
        return self._index


def hook_step(state, buffers):
    futs = [bps.push_pull_hook(state, IndexedBucket(b.clone(), i)) for i, b in enumerate(buffers)]
    return [f.wait().clone() for f in futs]


first = [torch.randn(1500, generator=gen), torch.randn(700, generator=gen)]
overflow = [first[0], first[1].clone()]
if r == 0:
    overflow[1][5] = float("inf")
second = [torch.randn(1500, generator=gen), torch.randn(700, generator=gen)]
skipped = bps.PushPullHookState(params=ONEBIT, prefix="skipped")
fresh = bps.PushPullHookState(params=ONEBIT, prefix="fresh")
kept = bps.PushPullHookState(params=ONEBIT, prefix="kept")
saved["skipped_first"] = hook_step(skipped, overflow)
saved["skipped_second"] = hook_step(skipped, second)
saved["fresh_second"] = hook_step(fresh, second)
hook_step(kept, first)
saved["kept_second"] = hook_step(kept, second)

# 7. PowerSGD (rank 2, after 2 uncompressed steps): each gradient of a bucket is a tensor of
# its own, its rows filled in from its shape; every bucket round recorded with the shapes.
POWERSGD = {"compressor": "powersgd", "rank": "2", "start_iter": "2"}
powersgd_state = bps.PushPullHookState(params=POWERSGD, prefix="powersgd")
powersgd_rounds = []


def recording_powersgd(state, bucket):
    name, x = state.name_of(bucket), bucket.buffer().clone()
    shapes = [tuple(g.shape) for g in bucket.gradients()]
    fut = bps.push_pull_hook(state, bucket)

    def record(f):
        powersgd_rounds.append((name, shapes, x, f.value().clone()))
        return f.value()

    return fut.then(record)


lowrank = DDP(make_model(), bucket_cap_mb=BUCKET_MB)
lowrank.register_comm_hook(powersgd_state, recording_powersgd)
opt_l = torch.optim.SGD(lowrank.parameters(), lr=0.5)
saved["powersgd_loss"] = [step(lowrank, opt_l, data_x, data_y) for _ in range(ONEBIT_STEPS)]
saved["powersgd_rounds"] = powersgd_rounds
saved["powersgd_map"] = POWERSGD
saved["powersgd_names"] = list(powersgd_state.bucket_names)

saved["metrics"] = bps.metrics()
torch.save(saved, os.path.join(out, f"rank{r}.pt"))
dist.destroy_process_group()
bps.shutdown()
print("done")
