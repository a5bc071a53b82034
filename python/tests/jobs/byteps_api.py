"""A worker of test_byteps_api.py: calls the parts of BytePS's and Horovod's APIs that
pushpull.torch added for drop-in scripts on fresh random tensors, and saves what it sent and
got to OUT/rank{R}.pt; bad calls must raise naming the argument (printed `ok CASE`). Usage:
byteps_api.py OUT SEED."""

import os
import sys

import torch

import pushpull
import pushpull.torch as bps
from job_common import expect
from pushpull.torch.parallel import DistributedDataParallel

out, seed = sys.argv[1], int(sys.argv[2])
torch.set_num_threads(1)
bps.init()
r, n = bps.rank(), bps.size()
gen = torch.Generator().manual_seed(seed * 1000 + r)
saved = {"rank": r, "size": n, "job_seed": bps._w().job_seed, "local_size": bps.local_size(),
         "num_servers": bps._w().num_servers}


def randn(*shape):
    return torch.randn(*shape, generator=gen) * 10


# push_pull_async: out of place, the input untouched.
x = randn(3001)
x_before = x.clone()
ha, hs = bps.push_pull_async(x, name="pa"), bps.push_pull_async(x, average=False, name="ps")
saved["pa_in"], saved["pa_out"], saved["ps_out"] = x_before, bps.synchronize(ha), bps.synchronize(hs)
assert torch.equal(x, x_before), "push_pull_async must not change its input"
assert saved["pa_out"].data_ptr() != x.data_ptr()

# BytePS's declare(name, **kwargs): declared for real at the first round, with that map.
KW = {"byteps_compressor_type": "onebit", "byteps_ef_type": "vanilla"}
bps.declare("kw", **KW)
bps.declare("kw", **KW)  # again, the same: nothing
assert not bps._w().is_declared("kw")
saved["kw_in"] = randn(20_000)
saved["kw_out"] = bps.push_pull_inplace(saved["kw_in"].clone(), average=True, name="kw")
expect("declare staleness", ValueError, "staleness = 1")(lambda: bps.declare("stale", staleness=1))
expect("declare again", ValueError, "'kw'", "onebit")(
    lambda: bps.declare("kw", byteps_compressor_type="topk"))

# compression=Compression.fp16: the tensor's compressor; a mismatch with the declared one raises.
saved["f16_in"] = randn(5000)
saved["f16_out"] = bps.push_pull(saved["f16_in"], average=False, name="f16c",
                                 compression=bps.Compression.fp16)
saved["f16avg_out"] = bps.synchronize(bps.push_pull_async(
    saved["f16_in"], name="f16a", compression=bps.Compression.fp16))
bps.declare("plain", 100)
expect("compression mismatch", ValueError, "'plain'", "fp16")(
    lambda: bps.push_pull(torch.zeros(100), name="plain", compression=bps.Compression.fp16))
expect("compression type", TypeError, "compression = 'fp16'")(
    lambda: bps.push_pull(torch.zeros(100), name="plain", compression="fp16"))

# version: only 0, in every form.
for form in ["push_pull", "push_pull_async", "push_pull_inplace", "push_pull_async_inplace"]:
    expect(f"version {form}", ValueError, "version = 2")(
        lambda: getattr(bps, form)(torch.zeros(100), True, "plain", 2))
expect("staleness", ValueError, "staleness = 1")(
    lambda: bps.push_pull_inplace(torch.zeros(100), name="plain", staleness=1))

# Integer tensors: exact sums, floor-divided averages, the dtype's wrap, broadcast.
ints = {
    "i32": torch.randint(-5000, 5000, (777,), generator=gen, dtype=torch.int32),
    "i64": torch.randint(-2**22, 2**22, (1001,), generator=gen, dtype=torch.int64),
    "i16": torch.randint(-300, 300, (64,), generator=gen, dtype=torch.int16),
    "i8": torch.randint(-128, 128, (9000,), generator=gen, dtype=torch.int8),
    "u8": torch.randint(0, 256, (333,), generator=gen, dtype=torch.uint8),
}
saved["int_in"] = {k: v.clone() for k, v in ints.items()}
saved["int_sum"] = {k: bps.push_pull(v, average=False, name=f"{k}.sum") for k, v in ints.items()}
saved["int_avg"] = {}
for k, v in ints.items():
    y = v.clone()
    h = bps.push_pull_async_inplace(y, name=f"{k}.avg")
    assert bps.synchronize(h) is y
    saved["int_avg"][k] = y
assert all(torch.equal(v, saved["int_in"][k]) for k, v in ints.items())
big = torch.full((10,), 2**23 + 5, dtype=torch.int64)
big_before = big.clone()
expect("integer overflow", ValueError, "'big'", "2**24")(
    lambda: bps.push_pull_inplace(big, average=False, name="big"))
assert torch.equal(big, big_before), "a refused integer round leaves the tensor unchanged"
expect("integer compression", ValueError, "'ints.fp16'", "uncompressed")(
    lambda: bps.push_pull(torch.ones(10, dtype=torch.int32), name="ints.fp16",
                          compression=bps.Compression.fp16))
saved["bint_in"] = torch.randint(-2**20, 2**20, (500, 3), generator=gen, dtype=torch.int32)
saved["bint_out"] = bps.broadcast(saved["bint_in"].clone(), root_rank=1, name="bint")

# Horovod's spellings.
h_in = randn(2049)
saved["hvd_in"] = h_in.clone()
saved["hvd_avg"] = bps.allreduce(h_in, name="hvd.avg")
saved["hvd_sum"] = bps.allreduce(h_in, name="hvd.sum", op=bps.Sum)
saved["hvd_avg_old"] = bps.allreduce(h_in, average=True, name="hvd.avg")
y = h_in.clone()
assert bps.allreduce_(y, name="hvd.inplace", op=bps.Sum) is y
saved["hvd_inplace"] = y
saved["hvd_async"] = bps.synchronize(bps.allreduce_async(h_in, name="hvd.async", op=bps.Average))
y = h_in.clone()
saved["hvd_async_"] = bps.synchronize(bps.allreduce_async_(y, name="hvd.async_", op=bps.Sum,
                                                           postscale_factor=0.5)).clone()
assert torch.equal(h_in, saved["hvd_in"])
expect("adasum", ValueError, "op = 2", "Adasum")(lambda: bps.allreduce(h_in, op=bps.Adasum))
# Min, Max and Product: float32 (out of place, async) and int64 (in place, grouped).
saved["hvd_min"] = bps.allreduce(h_in, name="hvd.min", op=bps.Min)
saved["hvd_max"] = bps.synchronize(bps.allreduce_async(h_in, name="hvd.max", op=bps.Max))
saved["hvd_prod"] = bps.allreduce(h_in[:64], name="hvd.prod", op=bps.Product)
ints = torch.randint(-1000, 1000, (7, 3), generator=gen, dtype=torch.int64)
saved["hvd_ints_in"] = ints.clone()
i2 = [ints.clone(), ints[0].clone()]
imax = bps.grouped_allreduce_(i2, name="hvd.imax", op=bps.Max)
assert imax[0] is i2[0] and imax[0].dtype == torch.int64
saved["hvd_imax"] = i2
y = ints.clone()
assert bps.allreduce_(y, name="hvd.iprod", op=bps.Product) is y
saved["hvd_iprod"] = y
assert torch.equal(h_in, saved["hvd_in"])
expect("min with a scale", ValueError, "scale factors", "Min")(
    lambda: bps.allreduce(h_in, op=bps.Min, postscale_factor=2.0))
expect("op and average", ValueError, "not both")(
    lambda: bps.allreduce(h_in, average=True, op=bps.Sum))

# Horovod's forms: process sets (the global one only), its exception names, hosts.
assert bps.is_initialized()
bps.init(lazy=False)  # as BytePS's own tests call it; joined already, so nothing happens
saved["hvd_ps"] = bps.allreduce(h_in, name="hvd.ps", op=bps.Sum,
                                process_set=bps.global_process_set)
saved["hvd_ps_all"] = bps.synchronize(bps.allreduce_async(
    h_in, name="hvd.ps_all", op=bps.Sum, process_set=bps.ProcessSet(range(n))))
expect("process set", ValueError, "process_set = ProcessSet([0])", "global_process_set")(
    lambda: bps.allreduce(h_in, name="hvd.ps", process_set=bps.ProcessSet([0])))
expect("process set barrier", ValueError, "barrier", "ProcessSet([1])")(
    lambda: bps.barrier(process_set=bps.ProcessSet([1])))
assert bps.cross_rank() == r // bps.local_size() and bps.cross_size() == n // bps.local_size()
# Grouped allreduce (out of place and in place), async broadcast, allgather_object, and
# synchronize of an unknown handle (None, as Horovod's and BytePS's).
g_in = [h_in.clone(), h_in[:100].clone() * 3]
saved["hvd_grouped"] = bps.grouped_allreduce(g_in, name="hvd.grouped", op=bps.Sum)
assert torch.equal(g_in[0], h_in), "grouped_allreduce must not change its inputs"
g2 = [t.clone() for t in g_in]
assert bps.grouped_allreduce_(g2, name="hvd.grouped", op=bps.Sum, postscale_factor=0.5)[0] is g2[0]
saved["hvd_grouped_"] = g2
b_in = randn(300)
saved["bcast_async_in"] = b_in.clone()
saved["bcast_async"] = bps.synchronize(bps.broadcast_async(b_in, root_rank=1, name="hvd.bcast"))
assert torch.equal(b_in, saved["bcast_async_in"]), "broadcast_async must not change its input"
assert bps.synchronize(10**9) is None
saved["objects"] = bps.allgather_object({"rank": r, "pad": "x" * (7 * r + 1)}, name="objs")


# A user-defined compressor in Horovod's shape: the round sums what compress gives.
class Doubled16:
    @staticmethod
    def compress(tensor):
        return (tensor * 2).to(torch.float16), tensor.dtype

    @staticmethod
    def decompress(tensor, ctx):
        return (tensor / 2).to(ctx)


u_in = randn(1000)
saved["user_in"] = u_in.clone()
saved["user_out"] = bps.allreduce(u_in, name="user.c", op=bps.Sum, compression=Doubled16)
y = u_in.clone()
assert bps.push_pull_inplace(y, average=False, name="user.c2", compression=Doubled16) is y
saved["user_inplace"] = y
assert torch.equal(u_in, saved["user_in"])
expect("user compressor in the optimizer", TypeError, "Doubled16", "compression_params")(
    lambda: bps.DistributedOptimizer(torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1),
                                     compression=Doubled16))
# DistributedOptimizer with Horovod's op=Sum, and with gradient_predivide_factor.
for key, kw in [("opsum", {"op": bps.Sum}), ("predivide", {"gradient_predivide_factor": 3.0})]:
    m = torch.nn.Linear(40, 30)
    o = bps.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), average="gradients",
                                 named_parameters=[(f"{key}.{k}", v) for k, v in m.named_parameters()],
                                 **kw)
    for p in m.parameters():
        p.grad = randn(*p.shape)
    saved[f"{key}_in"] = [p.grad.clone() for p in m.parameters()]
    o.synchronize()
    saved[f"{key}_out"] = [p.grad.clone() for p in m.parameters()]
expect("op with updates", ValueError, "average='updates'")(
    lambda: bps.DistributedOptimizer(torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1),
                                     average="updates", op=bps.Sum))
expect("bad compression", TypeError, "compress(tensor) -> (tensor, ctx)")(
    lambda: bps.push_pull(u_in, name="user.bad", compression=object()))
assert issubclass(bps.HostsUpdatedInterrupt, RuntimeError)
# A pushpull failure is Horovod's HorovodInternalError, a RuntimeError.
expect("horovod error", bps.HorovodInternalError, "'hvd.ps'")(
    lambda: bps.allreduce(torch.zeros(7), name="hvd.ps"))
expect("runtime error", RuntimeError, "'hvd.ps'")(
    lambda: bps.allreduce(torch.zeros(7), name="hvd.ps"))

# allgather: first dimensions differ by rank; -0.0 and integers survive; Horovod's positional
# name; a 0-dim tensor; trailing dimensions that differ raise on every rank.
g = randn(3 + 2 * r, 4)
g[0, 0] = -0.0
saved["ag_in"] = g.clone()
saved["ag_out"] = bps.allgather(g, name="ag")
saved["ag_int_in"] = torch.randint(-2**23, 2**23, (2 + r,), generator=gen, dtype=torch.int64)
saved["ag_int_out"] = bps.allgather(saved["ag_int_in"], "ag_int")  # Horovod: (tensor, name)
saved["ag_f64_in"] = torch.randn(5, 2, generator=gen, dtype=torch.float64)
saved["ag_f64_out"] = bps.synchronize(bps.allgather_async(saved["ag_f64_in"], name="ag_f64"))
saved["ag_scalar_in"] = randn(())
saved["ag_scalar_out"] = bps.allgather(saved["ag_scalar_in"], name="ag_scalar")
expect("allgather shapes", ValueError, "'ag_bad'", "beyond their first dimension")(
    lambda: bps.allgather(torch.zeros(2, 3 + r), name="ag_bad"))

# broadcast's autograd, as Horovod's: the gradient is averaged over the workers, to the root.
xb = randn(20).requires_grad_()
wb = randn(20)
yb = bps.broadcast(xb, root_rank=1, name="bcast.grad")
(yb * wb).sum().backward()
saved["bgrad"] = {"x": xb.detach().clone(), "w": wb, "y": yb.detach(), "grad": xb.grad.clone()}

# push_pull's autograd: the gradient of the sum is the sum of the gradients.
xa = randn(50).requires_grad_()
wa = randn(50)
ya = bps.push_pull(xa, average=False, name="autograd")
(ya * wa).sum().backward()
saved["autograd"] = {"x": xa.detach().clone(), "w": wa, "y": ya.detach(), "grad": xa.grad.clone()}

# broadcast_parameters / broadcast_optimizer_state with BytePS's prefix.
lin = torch.nn.Linear(5, 3)
with torch.no_grad():
    for p in lin.parameters():
        p.copy_(randn(*p.shape))
saved["prefix_in"] = {k: v.clone() for k, v in lin.state_dict().items()}
bps.broadcast_parameters(lin.state_dict(), root_rank=1, prefix="Custom.")
saved["prefix_out"] = {k: v.clone() for k, v in lin.state_dict().items()}
opt = torch.optim.SGD(lin.parameters(), lr=0.1 + r, momentum=0.9)
bps.broadcast_optimizer_state(opt, root_rank=1, prefix="Custom.")
saved["opt_lr"] = opt.param_groups[0]["lr"]

# suspend / resume: rounds in flight finish, new ones are refused, the job's own sizes resume.
hs = bps.push_pull_async(randn(100), name="before_suspend")
bps.suspend()
assert bps.poll(hs), "suspend() waits for the rounds in flight"
bps.synchronize(hs)
expect("suspended", pushpull.PushPullError, "suspended", "resume")(
    lambda: bps.push_pull(torch.zeros(100), name="plain"))
hosts = n // bps.local_size()
expect("resume workers", ValueError, f"num_workers = {hosts + 1}", "elastic resizing is not supported")(
    lambda: bps.resume(hosts + 1, saved["num_servers"]))
expect("resume servers", ValueError, "num_servers = 7", "elastic resizing is not supported")(
    lambda: bps.resume(hosts, 7))
bps.resume(hosts, saved["num_servers"], global_rank=r)
saved["after_resume"] = bps.push_pull(torch.full((100,), float(r + 1)), average=False, name="plain")

# A pending declare(name, **kwargs) survives a declaration refused while suspended (by a round
# and by pushpull's declare(name, tensor)): after resume the tensor gets the kwargs' map.
# allreduce_async_ refused (suspended, a wrong length) leaves its tensor unscaled.
bps.declare("kw.suspended", **KW)
bps.declare("kw.suspended2", **KW)
bps.suspend()
expect("suspended pending round", pushpull.PushPullError, "suspended")(
    lambda: bps.push_pull(torch.zeros(20_000), name="kw.suspended"))
expect("suspended pending declare", pushpull.PushPullError, "suspended")(
    lambda: bps.declare("kw.suspended2", torch.zeros(5000)))
y = randn(100)
y_before = y.clone()
expect("suspended prescale", pushpull.PushPullError, "suspended")(
    lambda: bps.allreduce_async_(y, name="plain", prescale_factor=3.0))
assert torch.equal(y, y_before), "a refused allreduce_async_ leaves its tensor unscaled"
bps.resume(hosts, saved["num_servers"])
y = randn(50)
y_before = y.clone()
expect("prescale wrong length", pushpull.PushPullError, "'plain'", "100 float32 elements")(
    lambda: bps.allreduce_async_(y, name="plain", prescale_factor=3.0))
assert torch.equal(y, y_before), "a refused allreduce_async_ leaves its tensor unscaled"
saved["kws_in"] = randn(20_000)
saved["kws_out"] = bps.push_pull(saved["kws_in"], name="kw.suspended")
bps.declare("kw.suspended2", torch.zeros(5000))
saved["kws_params"] = {k: dict(bps._state.declared[k].params)
                       for k in ("kw.suspended", "kw.suspended2")}
# allreduce_async_'s prescale on float16: in float32, after the widening.
saved["hvd16_in"] = (randn(3000) / 10).to(torch.float16)
y = saved["hvd16_in"].clone()
saved["hvd16_out"] = bps.synchronize(bps.allreduce_async_(
    y, name="hvd.f16", op=bps.Sum, prescale_factor=0.1, postscale_factor=0.5)).clone()

# DistributedOptimizer.set_backward_passes_per_step: 1 pass, then 2 accumulated passes.
torch.manual_seed(seed)
mlp = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
saved["bp_init"] = {k: v.clone() for k, v in mlp.state_dict().items()}
dopt = bps.DistributedOptimizer(torch.optim.SGD(mlp.parameters(), lr=0.1), mlp.named_parameters())
expect("passes", ValueError, "passes = 0")(lambda: dopt.set_backward_passes_per_step(0))
saved["bp_batches"] = []
for step, passes in enumerate([1, 2, 2]):
    dopt.set_backward_passes_per_step(passes)
    dopt.zero_grad()
    batches = []
    for _ in range(passes):
        xb, yb = torch.randn(6, 8, generator=gen), torch.randint(0, 3, (6,), generator=gen)
        batches.append((xb, yb))
        torch.nn.functional.cross_entropy(mlp(xb), yb).backward()
    saved["bp_batches"].append(batches)
    dopt.step()
saved["bp_out"] = {k: v.clone() for k, v in mlp.state_dict().items()}

# DistributedDataParallel: rank 0's parameters at construction, averaged gradients after
# backward, buffers from rank 0 at each forward, no_sync accumulating locally.
torch.manual_seed(seed + 17 * r)  # different on every rank: the construction broadcasts rank 0's
net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16), torch.nn.ReLU(),
                          torch.nn.Linear(16, 3))
saved["ddp_init_in"] = {k: v.clone() for k, v in net.state_dict().items()}
ddp = DistributedDataParallel(net, compression=bps.Compression.none)
saved["ddp_init_out"] = {k: v.clone() for k, v in net.state_dict().items()}
sgd = torch.optim.SGD(ddp.parameters(), lr=0.05)
saved["ddp_batches"], saved["ddp_grads"] = [], []
for step in range(3):
    sgd.zero_grad()
    micro = 2 if step == 1 else 1
    batches = []
    for m in range(micro):
        xb, yb = torch.randn(6, 8, generator=gen), torch.randint(0, 3, (6,), generator=gen)
        batches.append((xb, yb))
        ctx = ddp.no_sync() if m < micro - 1 else torch.enable_grad()
        with ctx:
            torch.nn.functional.cross_entropy(ddp(xb), yb).backward()
    saved["ddp_batches"].append(batches)
    saved["ddp_grads"].append({k: p.grad.clone() for k, p in net.named_parameters()})
    sgd.step()
saved["ddp_out"] = {k: v.clone() for k, v in net.named_parameters()}
# Eval mode: a forward leaves the buffers as broadcast from rank 0.
net.eval()
with torch.no_grad():
    net[1].running_mean.add_(100.0 * r)
    saved["ddp_bn_before"] = net[1].running_mean.clone()
    ddp(torch.randn(2, 8, generator=gen))
saved["ddp_bn_after"] = net[1].running_mean.clone()

# join and barrier.
bps.barrier()
saved["join"] = bps.join()

saved["metrics"] = bps.metrics()
torch.save(saved, os.path.join(out, f"rank{r}.pt"))
bps.shutdown()
print("done")
