"""A job for test_metrics.py: each worker serves Prometheus metrics (`PUSHPULL_METRICS`, set by
the test), trains a small model for STEPS steps through DistributedOptimizer with onebit on
the large tensor, then scrapes its own endpoint over HTTP and saves what it read beside its
own counters (`pushpull.torch.metrics()`) to OUT/metrics-RANK.json."""

import json
import sys
import urllib.request
from pathlib import Path

import torch

import pushpull.torch as bps
from pushpull.torch._state import _w

STEPS = 5


def scrape(addr: str) -> dict:
    """`name{labels}` -> value of every sample on the endpoint."""
    with urllib.request.urlopen(f"http://{addr}/metrics", timeout=30) as r:
        text = r.read().decode()
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            samples[name] = float(value)
    return samples


def main(out: Path, seed: int) -> None:
    bps.init()
    rank = bps.rank()
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 4))
    bps.broadcast_parameters(model.state_dict(), root_rank=0)

    def params(name):
        if name == "Gradient.0.weight":
            return {"compressor": "onebit", "ef": "vanilla"}
        return {}

    opt = bps.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1),
        named_parameters=model.named_parameters(),
        compression_params=lambda name: params(f"Gradient.{name}"),
        fuse_small=False,  # every gradient its own tensor: the per-tensor families are checked
    )
    gen = torch.Generator().manual_seed(seed * 31 + rank)
    for _ in range(STEPS):
        x = torch.randn(32, 64, generator=gen)
        y = torch.randint(0, 4, (32,), generator=gen)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    addr = _w().metrics_address
    own = bps.metrics()
    scraped = scrape(addr)
    (out / f"metrics-{rank}.json").write_text(
        json.dumps({"address": addr, "own": own, "scraped": scraped}, default=str)
    )
    bps.shutdown()


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]))
