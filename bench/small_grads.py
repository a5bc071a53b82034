"""The exchange of a model's small gradients alone: `DistributedOptimizer.synchronize()` over
the parameters of a torchvision model whose gradients are under `cluster.min_compress_bytes`
(64 KiB by default: biases and normalisation weights, which travel as float32), with random
gradients set by hand and no backward pass, so nothing but their rounds is timed; fused into
one tensor per bucket (the default) or each its own round (`--no-fuse`).

    pushpull local --workers 1 -- python bench/small_grads.py            # fused
    pushpull local --workers 1 -- python bench/small_grads.py --no-fuse  # one round each

Prints the median and the fastest `synchronize()` of the timed rounds and the tensors the
worker declared. Runs on the CPU, or with `--device cuda` on a GPU.
"""

import argparse
import time

import torch
import torchvision

import pushpull.torch as bps


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="resnet50")
    p.add_argument("--device", default="cpu")
    p.add_argument("--no-fuse", action="store_true", help="each small gradient its own round")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--rounds", type=int, default=20)
    a = p.parse_args()
    bps.init()
    model = getattr(torchvision.models, a.model)().to(a.device)
    small = [(n, q) for n, q in model.named_parameters() if bps._w().is_small(q.numel())]
    opt = bps.DistributedOptimizer(
        torch.optim.SGD([q for _, q in small], lr=0.01), named_parameters=small,
        fuse_small=not a.no_fuse,
    )
    g = torch.Generator().manual_seed(1)
    times = []
    for i in range(a.warmup + a.rounds):
        for _, q in small:
            q.grad = torch.randn(q.shape, generator=g).to(a.device)
        if a.device.startswith("cuda"):
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        opt.synchronize()
        if a.device.startswith("cuda"):
            torch.cuda.synchronize()
        if i >= a.warmup:
            times.append(time.perf_counter() - t0)
    times.sort()
    declared = [n for n in bps.metrics()["tensors"] if n.startswith("Gradient")]
    print(f"{a.model}: {len(small)} small gradients ({sum(q.numel() for _, q in small) * 4} "
          f"bytes), {'unfused' if a.no_fuse else 'fused'}: synchronize median "
          f"{1e3 * times[len(times) // 2]:.2f} ms, fastest {1e3 * times[0]:.2f} ms; "
          f"{len(declared)} tensors declared")
    bps.shutdown()


if __name__ == "__main__":
    main()
