"""A worker of test_errors.py: each bad call raises an exception naming the tensor and the key
or value; prints `ok CASE` for each. Usage: errors.py."""

import torch

import pushpull
import pushpull.torch as bps
from job_common import expect

bps.init()
r = bps.rank()


expect("dtype", TypeError, "'cplx'", "torch.complex64")(
    lambda: bps.push_pull(torch.zeros(5, dtype=torch.complex64), name="cplx"))
bps.declare("len", 10)
expect("length", pushpull.PushPullError, "'len'", "10", "11")(
    lambda: bps.push_pull(torch.zeros(11), name="len"))
expect("undeclared", pushpull.PushPullError, "nope")(
    lambda: bps._w().push_pull("nope", torch.zeros(3), 0, 3, True))
expect("handle", ValueError, "handle 12345")(lambda: bps.poll(12345))
# synchronize of an unknown handle returns None, as BytePS's and Horovod's.
assert bps.synchronize(12345) is None
expect("bad map", pushpull.PushPullError, '"bad"', "byteps_compressor_type", "zip")(
    lambda: bps.declare("bad", 100_000, {"byteps_compressor_type": "zip"}))
expect("map types", TypeError, "'types'", "0.5")(
    lambda: bps.declare("types", 10, {"byteps_compressor_k": 0.5}))
# Rank 0 and rank 1 declare different lengths: both fail, naming the tensor and both values.
expect("mismatch", pushpull.PushPullError, "mismatch", "1000", "999")(
    lambda: bps.declare("mismatch", 1000 - r))
expect("priority", ValueError, "'len'", "priority")(
    lambda: bps.push_pull(torch.zeros(10), name="len", priority=5))
model = torch.nn.Linear(4, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
expect("nesterov", ValueError, "Gradient.weight", "nesterov", "momentum=0.9")(
    lambda: bps.DistributedOptimizer(opt, model.named_parameters(),
                                     compression_params={"byteps_momentum_type": "nesterov"}))
expect("optimizer staleness", ValueError, "staleness = 1")(
    lambda: bps.DistributedOptimizer(opt, model.named_parameters(), staleness=1))
expect("warmup compression", ValueError, "warmup_compression = 'onebit'", "'fp16'")(
    lambda: bps.DistributedOptimizer(opt, model.named_parameters(),
                                     warmup_compression="onebit"))
expect("warmup unused", ValueError, "warmup_compression = 'fp16'", "average='gradients'")(
    lambda: bps.DistributedOptimizer(opt, model.named_parameters(), average="gradients",
                                     warmup_compression="fp16"))
# The job still works after all of that.
assert torch.equal(bps.push_pull(torch.ones(10), average=False, name="len"), torch.full((10,), 2.0))
bps.shutdown()
# Horovod allows init() after shutdown(); here the job has ended: refused at once, saying why.
expect("init after shutdown", pushpull.PushPullError, "init() after shutdown()", "new process")(
    bps.init)
print("done")
