"""A worker of test_launcher.py's lost-node tests: one round, then rank 1 stops (HOW = `kill`:
SIGKILL; `raise`: an uncaught exception; `finally`: an exception, with shutdown() in a
`finally` block, i.e. a clean finish) while rank 0 keeps pushing; rank 0 prints the error that
names worker 1. HOW = `ordered`: DistributedOptimizer steps with ordered_step=True on the
emulated route, rank 1 killed after the first; rank 0's next step is released by its failed
rounds and the error comes with the step after (`lost in backward N`). Usage: lost.py HOW."""

import os
import signal
import sys

import torch

import pushpull
import pushpull.torch as bps

how = sys.argv[1]
if how == "ordered":
    os.environ["PUSHPULL_TORCH_ROUTE"] = "emulated"
bps.init()
bps.push_pull(torch.ones(1000), name="g")
if how == "ordered":
    p = torch.nn.Parameter(torch.zeros(1000))
    opt = bps.DistributedOptimizer(torch.optim.SGD([p], lr=0.1), [("p", p)], ordered_step=True)
    where = "nowhere"
    try:
        for step in range(1000):
            opt.zero_grad()
            where = f"backward {step}"
            p.sum().backward()
            where = f"step {step}"
            opt.step()
            if bps.rank() == 1:
                os.kill(os.getpid(), signal.SIGKILL)
    except pushpull.NodeLostError as e:
        print(f"lost: in {where}: {e}", flush=True)
        sys.exit(0)
    print("no error", flush=True)
    sys.exit(1)
if bps.rank() == 1:
    if how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        raise RuntimeError("the training script of rank 1 failed")
    finally:
        if how == "finally":
            bps.shutdown()
try:
    for _ in range(1000):
        bps.push_pull(torch.ones(1000), name="g")
except (pushpull.NodeLostError if how != "finally" else pushpull.PushPullError) as e:
    print(f"lost: {e}", flush=True)
    sys.exit(0)
print("no error", flush=True)
sys.exit(1)
