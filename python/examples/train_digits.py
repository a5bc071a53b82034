"""Trains a small MLP on scikit-learn's digits (8x8 images of handwritten digits, shipped with
scikit-learn: no download) with pushpull, BytePS-style. Run it on 2 workers:

    pushpull local --workers 2 -- python python/examples/train_digits.py --compression onebit

Each worker trains on its own half of the training set; gradients are averaged with
DistributedOptimizer. `--compression none` sends float32 gradients (SGD with momentum 0.9);
`onebit` sends one bit per element with error feedback, and Nesterov momentum on the worker
(so the optimizer itself is plain SGD). Rank 0 prints the test accuracy, the bytes each
worker pushed, and where the gradients were compressed. `--device cuda` trains on the GPU
(worker r on GPU r modulo the GPUs there are): the gradients are then CUDA tensors, compressed
on the GPU by pushpull's kernels.
"""

import argparse

import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import pushpull.torch as bps

ONEBIT = {"byteps_compressor_type": "onebit", "byteps_ef_type": "vanilla",
          "byteps_momentum_type": "nesterov"}

parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
parser.add_argument("--compression", choices=["none", "onebit"], default="onebit")
parser.add_argument("--epochs", type=int, default=40)
parser.add_argument("--batch", type=int, default=32, help="samples per worker per step")
parser.add_argument("--lr", type=float, default=0.05)
parser.add_argument("--seed", type=int, default=0)
parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
args = parser.parse_args()

torch.set_num_threads(1)
bps.init()
rank, size = bps.rank(), bps.size()
dev = torch.device("cpu")
if args.device == "cuda":
    dev = torch.device("cuda", bps.local_rank() % torch.cuda.device_count())

digits = load_digits()
x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
y = torch.tensor(digits.target)
x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.2, random_state=0, stratify=y)
x_train, y_train = x_train[rank::size], y_train[rank::size]  # this worker's shard
x_train, y_train, x_test, y_test = (t.to(dev) for t in (x_train, y_train, x_test, y_test))

torch.manual_seed(args.seed)
model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
model = model.to(dev)
bps.broadcast_parameters(model.state_dict(), root_rank=0)
if args.compression == "onebit":
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    opt = bps.DistributedOptimizer(opt, model.named_parameters(), compression_params=ONEBIT)
else:
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    opt = bps.DistributedOptimizer(opt, model.named_parameters())

gen = torch.Generator().manual_seed(args.seed * 100 + rank)
steps = len(x_train) // args.batch  # the same on every worker (shards differ by at most one)
for epoch in range(args.epochs):
    order = torch.randperm(len(x_train), generator=gen).to(dev)
    for s in range(steps):
        idx = order[s * args.batch:(s + 1) * args.batch]
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x_train[idx]), y_train[idx]).backward()
        opt.step()

with torch.no_grad():
    logits = model(x_test)
    accuracy = (logits.argmax(1) == y_test).float().mean().item()
    test_loss = torch.nn.functional.cross_entropy(logits, y_test).item()
m = bps.metrics()
places = sorted({t["device"] for n, t in m["tensors"].items() if n.startswith("Gradient.")})
line = (f"compression {args.compression}, seed {args.seed}: test accuracy {100 * accuracy:.2f} % "
        f"(loss {test_loss:.4f}), pushed "
        f"{m['bytes_pushed'] / 1e6:.2f} MB of {m['raw_bytes'] / 1e6:.2f} MB float32 "
        f"({m['compression_ratio']:.1f}x less) in {m['rounds']} rounds, "
        f"compressed on {', '.join(places)}")
print(line if rank == 0 else f"worker {rank}: pushed {m['bytes_pushed'] / 1e6:.2f} MB")
bps.shutdown()
