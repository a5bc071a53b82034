"""Times push_pull of ResNet-50's 161 gradient tensors (25,557,032 float32 elements, shapes as
torchvision's resnet50) from PyTorch, to compare the Python binding with the Rust benchmark job
on the same cluster:

    pushpull local --workers 2 --servers 2 -- python python/examples/bench_push_pull.py
    pushpull local --workers 2 --servers 2 --job benchmark --rounds 5 --warmup 1

Each round issues every tensor with push_pull_async_inplace, last layer first (as a backward
pass produces them), then synchronizes them all. Rank 0 prints seconds per round and the
gradient GB/s (fp32 bytes per worker per second).
"""

import argparse
import time

import torch

import pushpull.torch as bps


def resnet50_shapes():
    """(name, shape) of torchvision's resnet50 parameters, in state_dict order."""
    out = [("conv1.weight", (64, 3, 7, 7)), ("bn1.weight", (64,)), ("bn1.bias", (64,))]
    inplanes = 64
    for li, (planes, blocks) in enumerate([(64, 3), (128, 4), (256, 6), (512, 3)], start=1):
        for b in range(blocks):
            p = f"layer{li}.{b}"
            out += [(f"{p}.conv1.weight", (planes, inplanes, 1, 1)),
                    (f"{p}.bn1.weight", (planes,)), (f"{p}.bn1.bias", (planes,)),
                    (f"{p}.conv2.weight", (planes, planes, 3, 3)),
                    (f"{p}.bn2.weight", (planes,)), (f"{p}.bn2.bias", (planes,)),
                    (f"{p}.conv3.weight", (planes * 4, planes, 1, 1)),
                    (f"{p}.bn3.weight", (planes * 4,)), (f"{p}.bn3.bias", (planes * 4,))]
            if b == 0:
                out += [(f"{p}.downsample.0.weight", (planes * 4, inplanes, 1, 1)),
                        (f"{p}.downsample.1.weight", (planes * 4,)),
                        (f"{p}.downsample.1.bias", (planes * 4,))]
            inplanes = planes * 4
    return out + [("fc.weight", (1000, 2048)), ("fc.bias", (1000,))]


parser = argparse.ArgumentParser()
parser.add_argument("--rounds", type=int, default=5)
parser.add_argument("--warmup", type=int, default=1)
args = parser.parse_args()

bps.init()
shapes = resnet50_shapes()
grads = [torch.randn(s) for _, s in shapes]
numel = sum(g.numel() for g in grads)
assert len(shapes) == 161 and numel == 25_557_032, (len(shapes), numel)
for (name, _), g in zip(shapes, grads):
    bps.declare(name, g)
times = []
for r in range(args.warmup + args.rounds):
    start = time.perf_counter()
    handles = [bps.push_pull_async_inplace(g, average=False, name=n)
               for (n, _), g in reversed(list(zip(shapes, grads)))]
    for h in handles:
        bps.synchronize(h)
    if r >= args.warmup:
        times.append(time.perf_counter() - start)
per_round = sum(times) / len(times)
if bps.rank() == 0:
    print(f"python push_pull: {len(shapes)} tensors, {numel} elements, {args.rounds} rounds: "
          f"{per_round:.3f} s/round, gradient {4 * numel / per_round / 1e9:.3f} GB/s")
bps.shutdown()
