"""A worker of test_launcher.py's lost-node test: one round, then rank 1 kills itself
(SIGKILL) and rank 0 keeps pushing; rank 0 prints the error that names the lost worker.
Usage: lost.py."""

import os
import signal
import sys

import torch

import pushpull
import pushpull.torch as bps

bps.init()
bps.push_pull(torch.ones(1000), name="g")
if bps.rank() == 1:
    os.kill(os.getpid(), signal.SIGKILL)
try:
    for _ in range(1000):
        bps.push_pull(torch.ones(1000), name="g")
except pushpull.NodeLostError as e:
    print(f"lost: {e}", flush=True)
    sys.exit(0)
print("no error", flush=True)
sys.exit(1)
