"""Onebit with error feedback under the user's own optimizer: a simulated round.

`DistributedOptimizer` compresses the gradient and hands the pulled average to the user's
torch optimizer. With onebit and error feedback (EF) in front of `torch.optim.SGD(momentum=0.9)`
or `torch.optim.Adam`, a small CNN loses tens of points. This script simulates that round in
one process (W workers, no network) on scikit-learn's digits, so each part of the round can be
switched on or off, and it simulates two optimizer-aware alternatives.

The round, as pushpull does it:

* **Worker EF** (`codecs/src/chain.rs`, vanilla): `p = x + e`, push `C(p)`, keep
  `e = p - C(p)`.
* **Onebit** (`codecs/src/codecs/onebit.rs`, `scaling = true`): one scale per chunk,
  `mean |p|`, and one sign bit per element, set for `p < 0`. Element i decodes to `-scale`
  if its bit is set, else `+scale`. Here there is one scale per tensor. The largest tensor
  (the first linear layer's weight) has 32768 elements, one 128 KiB chunk, so that is the same
  as pushpull's per-chunk scale.
* **Server**: sums the W decoded pushes in rank order, then re-encodes the sum with onebit
  and its own EF before the workers pull it (`--server ef`). `--server none` pulls the sum
  uncompressed, to isolate the worker's half.
* Every tensor is compressed. pushpull would send tensors under `cluster.min_compress_bytes`
  (64 KiB: all of this model's tensors but one) as float32.

Modes (`--mode`):

* `none`: the float32 average gradient goes to the user's optimizer. This is the baseline.
* `grad`: the compressed average gradient goes to the user's optimizer, as today's
  `DistributedOptimizer` does. With Adam, `--adam-m true` or `--adam-v true` feeds that moment
  the true average gradient and the other one the compressed one. These are oracles that
  isolate which moment the compression breaks.
* `local` (SGD): each worker keeps its own heavy-ball momentum `m_w = mu m_w + g_w` and pushes
  it, so it pushes its update delta divided by -lr. Every worker applies `p -= lr * avg`.
  Uncompressed, this is the same as SGD with momentum on the average gradient, because
  momentum is linear.
* `delta` (Adam): each worker runs Adam (its own m and v) on its local gradient and pushes the
  update `m_hat / (sqrt(v_hat) + eps)`. Every worker applies `p -= lr * avg`.

Data and model: 1400 training and 397 test images (a fixed split), batches of 32 per worker,
10 epochs, 2 conv layers and 2 linear layers. A seed fixes the initial weights and the batch
order. The script prints the test accuracy after the last epoch. Runs are deterministic: the
same seed gives the same bits.

    python bench/onebit_optimizers.py --opt adam --lr 1e-2 --mode grad --seeds 0,1,2
    python bench/onebit_optimizers.py --table                  # every row, markdown
    python bench/onebit_optimizers.py --table sgd-grad-ef,sgd-local-none
    python bench/onebit_optimizers.py --list                   # the row names
"""

import argparse
import dataclasses
import statistics
import sys
import time
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from sklearn.datasets import load_digits

BATCH = 32
TRAIN = 1400
ADAM_B1, ADAM_B2, ADAM_EPS = 0.9, 0.999, 1e-8  # torch.optim.Adam's defaults
ADAM_1B1, ADAM_1B2 = 0.1, 0.001  # 1 - beta as literals (1 - 0.9 in floats is 0.0999...98)


@dataclass(frozen=True)
class Settings:
    opt: str = "sgd"  # "sgd" (torch SGD with momentum mu) or "adam" (torch Adam)
    lr: float = 0.1
    mu: float = 0.9  # SGD momentum
    mode: str = "none"  # none | grad | local | delta
    server: str = "ef"  # ef: the server re-encodes the sum with its own EF; none: float32 sum
    worker_ef: bool = True  # False: the worker pushes C(g), scaled sign without EF
    scale: str = "l1"  # l1: mean |p| (onebit.rs); l2: ||p||_2 / sqrt(n)
    adam_m: str = "comp"  # grad mode with Adam: m fed the compressed ("comp") or true gradient
    adam_v: str = "comp"  # the same for v
    workers: int = 2
    epochs: int = 10


def check(s: Settings) -> None:
    """Raises ValueError for a combination the script does not simulate."""
    if s.mode == "local" and s.opt != "sgd":
        raise ValueError("--mode local is SGD's: use --mode delta with Adam")
    if s.mode == "delta" and s.opt != "adam":
        raise ValueError("--mode delta is Adam's: use --mode local with SGD")
    if (s.adam_m, s.adam_v) != ("comp", "comp") and (s.opt, s.mode) != ("adam", "grad"):
        raise ValueError("--adam-m and --adam-v need --opt adam --mode grad")
    if s.workers < 1 or s.epochs < 1:
        raise ValueError("--workers and --epochs must be at least 1")


# --- the codec and the round ------------------------------------------------------------------


def onebit(x: torch.Tensor, scale: str) -> torch.Tensor:
    """Encodes and decodes `x` as one scale for the whole tensor and one sign per element."""
    f = x.reshape(1, -1)  # one chunk: the scale is a reduction over dim 1
    n = torch.full((1, 1), float(f.shape[1]))
    if scale == "l2":
        s = (f.pow(2).sum(1, keepdim=True) / n).sqrt()
    else:
        s = f.abs().sum(1, keepdim=True) / n
    return torch.where(f < 0, -s, s).view_as(x)


class ErrorFeedback:
    """Vanilla error feedback around onebit, one residual per tensor (key)."""

    def __init__(self, scale: str, on: bool = True):
        self.scale, self.on, self.residual = scale, on, {}

    def __call__(self, key: int, x: torch.Tensor) -> torch.Tensor:
        if not self.on:
            return onebit(x, self.scale)
        p = x + self.residual.get(key, 0)
        c = onebit(p, self.scale)
        self.residual[key] = p - c
        return c


class Round:
    """pushpull's round for one tensor: worker EF and onebit, server sum, server re-encode."""

    def __init__(self, s: Settings):
        self.s = s
        self.workers = [ErrorFeedback(s.scale, s.worker_ef) for _ in range(s.workers)]
        self.server = ErrorFeedback(s.scale)

    def average(self, key: int, pushes: list) -> torch.Tensor:
        """What every worker pulls for the pushes of W workers: the compressed average."""
        total = sum(ef(key, x) for ef, x in zip(self.workers, pushes))  # rank order
        if self.s.server == "ef":
            total = self.server(key, total)
        return total / self.s.workers


# --- one step per mode --------------------------------------------------------------------------
# grads[w][k] is worker w's gradient of parameter k. Each function updates params in place.


def step_none(s, state, params, grads, opt):
    """The float32 average gradient, then the user's optimizer."""
    for k, p in enumerate(params):
        p.grad = sum(g[k] for g in grads) / s.workers
    opt.step()


def step_grad(s, state, params, grads, opt):
    """The compressed average gradient, then the user's optimizer (today's DistributedOptimizer).

    With an Adam oracle (`adam_m` or `adam_v` = "true") Adam is written out by hand, with
    torch's defaults and no weight decay, so that m and v can be fed different gradients.
    """
    pulled = [state.round.average(k, [g[k] for g in grads]) for k in range(len(params))]
    if s.adam_m == "comp" and s.adam_v == "comp":
        for p, h in zip(params, pulled):
            p.grad = h
        opt.step()
        return
    t = state.step + 1
    with torch.no_grad():
        for k, p in enumerate(params):
            true = sum(g[k] for g in grads) / s.workers
            gm = true if s.adam_m == "true" else pulled[k]
            gv = true if s.adam_v == "true" else pulled[k]
            m, v = state.m[0][k], state.v[0][k]
            m.mul_(ADAM_B1).add_(gm, alpha=ADAM_1B1)
            v.mul_(ADAM_B2).addcmul_(gv, gv, value=ADAM_1B2)
            p.sub_(s.lr * (m / (1 - ADAM_B1**t)) / ((v / (1 - ADAM_B2**t)).sqrt() + ADAM_EPS))


def step_local(s, state, params, grads, opt):
    """SGD: each worker's own heavy-ball momentum is pushed; p -= lr * the pulled average."""
    with torch.no_grad():
        for k, p in enumerate(params):
            for w in range(s.workers):
                state.m[w][k].mul_(s.mu).add_(grads[w][k])
            p.sub_(s.lr * state.round.average(k, [m[k] for m in state.m]))


def step_delta(s, state, params, grads, opt):
    """Adam: each worker runs Adam on its own gradient and pushes the update; p -= lr * avg."""
    t = state.step + 1
    with torch.no_grad():
        for k, p in enumerate(params):
            updates = []
            for w in range(s.workers):
                g, m, v = grads[w][k], state.m[w][k], state.v[w][k]
                m.mul_(ADAM_B1).add_(g, alpha=ADAM_1B1)
                v.mul_(ADAM_B2).addcmul_(g, g, value=ADAM_1B2)
                updates.append((m / (1 - ADAM_B1**t)) / ((v / (1 - ADAM_B2**t)).sqrt() + ADAM_EPS))
            p.sub_(s.lr * state.round.average(k, updates))


STEPS = {"none": step_none, "grad": step_grad, "local": step_local, "delta": step_delta}


class State:
    """What a run carries between steps: the round's residuals, per-worker moments, the step."""

    def __init__(self, s: Settings, params):
        self.round = Round(s)
        self.m = [[torch.zeros_like(p) for p in params] for _ in range(s.workers)]
        self.v = [[torch.zeros_like(p) for p in params] for _ in range(s.workers)]
        self.step = 0


# --- training -----------------------------------------------------------------------------------


def digits():
    """The images as (N, 1, 8, 8) floats in [0, 1], the labels, and a fixed train/test split."""
    d = load_digits()
    x = torch.tensor(d.images / 16.0, dtype=torch.float32).unsqueeze(1)
    y = torch.tensor(d.target)
    perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(1))
    return x, y, perm[:TRAIN], perm[TRAIN:]


def net() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(),
        nn.MaxPool2d(2), nn.Flatten(), nn.Linear(32 * 16, 64), nn.ReLU(), nn.Linear(64, 10))


def train(s: Settings, seed: int, data) -> float:
    """Trains one run and returns its test accuracy in percent."""
    x, y, train_idx, test_idx = data
    torch.manual_seed(seed)  # the initial weights
    order_rng = torch.Generator().manual_seed(1000 + seed)  # the batch order
    model = net()
    params = list(model.parameters())
    if s.opt == "adam":
        opt = torch.optim.Adam(params, lr=s.lr)
    else:
        opt = torch.optim.SGD(params, lr=s.lr, momentum=s.mu)
    state = State(s, params)
    step = STEPS[s.mode]
    W = s.workers
    for _ in range(s.epochs):
        order = train_idx[torch.randperm(len(train_idx), generator=order_rng)]
        for i in range(len(train_idx) // (W * BATCH)):
            grads = []
            for w in range(W):  # worker w's batch is the w-th of this step's W batches
                idx = order[(i * W + w) * BATCH:(i * W + w + 1) * BATCH]
                model.zero_grad()
                F.cross_entropy(model(x[idx]), y[idx]).backward()
                grads.append([p.grad.detach().clone() for p in params])
            step(s, state, params, grads, opt)
            state.step += 1
    with torch.no_grad():
        return 100 * (model(x[test_idx]).argmax(1) == y[test_idx]).float().mean().item()


def runs(s: Settings, seeds, data) -> list:
    return [train(s, seed, data) for seed in seeds]


def mean_sd(accs) -> str:
    sd = statistics.stdev(accs) if len(accs) > 1 else 0.0
    return f"{statistics.mean(accs):.1f} ± {sd:.1f}"


# --- the table ----------------------------------------------------------------------------------

SGD, SGD01 = Settings(opt="sgd", lr=0.1), Settings(opt="sgd", lr=0.01)
ADAM, ADAM3 = Settings(opt="adam", lr=1e-2), Settings(opt="adam", lr=1e-3)


def row(name, group, scheme, base, **change):
    return name, group, scheme, dataclasses.replace(base, **change)


# (name, group, scheme, settings). BENCHMARKS.md's "Onebit with the user's optimizer".
ROWS = [
    row("sgd-none", "SGD μ0.9 lr0.1", "uncompressed", SGD),
    row("sgd-grad-ef", "", "grad, server EF (today's DistributedOptimizer)", SGD, mode="grad"),
    row("sgd-grad-none", "", "grad, server none", SGD, mode="grad", server="none"),
    row("sgd-grad-noef", "", "grad, scaled sign without EF, server none", SGD, mode="grad",
        server="none", worker_ef=False),
    row("sgd-local-ef", "", "local momentum (update delta), server EF", SGD, mode="local"),
    row("sgd-local-none", "", "local momentum, server none", SGD, mode="local", server="none"),
    row("sgd-local-none-l2", "", "local momentum, server none, scale ‖p‖₂/√n", SGD,
        mode="local", server="none", scale="l2"),
    row("sgd-mu0-none", "SGD μ0 lr1.0", "uncompressed", SGD, mu=0.0, lr=1.0),
    row("sgd-mu0-grad-none", "", "grad, server none", SGD, mu=0.0, lr=1.0, mode="grad",
        server="none"),
    row("sgd-mu05-grad-none", "SGD μ0.5 lr0.5", "grad, server none", SGD, mu=0.5, lr=0.5,
        mode="grad", server="none"),
    row("sgd-mu08-grad-none", "SGD μ0.8 lr0.2", "grad, server none", SGD, mu=0.8, lr=0.2,
        mode="grad", server="none"),
    row("sgd01-none", "SGD μ0.9 lr0.01", "uncompressed", SGD01),
    row("sgd01-grad-ef", "", "grad, server EF", SGD01, mode="grad"),
    row("sgd01-local-none-l2", "", "local, server none, scale ‖p‖₂/√n", SGD01, mode="local",
        server="none", scale="l2"),
    row("adam-none", "Adam 1e-2", "uncompressed", ADAM),
    row("adam-grad-ef", "", "grad, server EF", ADAM, mode="grad"),
    row("adam-grad-vtrue", "", "grad, v from the true gradient, m compressed, server none", ADAM,
        mode="grad", server="none", adam_v="true"),
    row("adam-grad-mtrue", "", "grad, m from the true gradient, v compressed, server none", ADAM,
        mode="grad", server="none", adam_m="true"),
    row("adam-delta-ef", "", "update delta, server EF", ADAM, mode="delta"),
    row("adam3-none", "Adam 1e-3", "uncompressed", ADAM3),
    row("adam3-grad-ef", "", "grad, server EF", ADAM3, mode="grad"),
    row("adam3-delta-ef", "", "update delta, server EF", ADAM3, mode="delta"),
    row("w4-adam-none", "W=4, Adam 1e-2", "uncompressed", ADAM, workers=4),
    row("w4-adam-grad-ef", "", "grad, server EF", ADAM, workers=4, mode="grad"),
    row("w4-adam-delta-ef", "", "update delta, server EF", ADAM, workers=4, mode="delta"),
    row("w4-sgd-none", "W=4, SGD 0.1", "uncompressed", SGD, workers=4),
    row("w4-sgd-grad-ef", "", "grad, server EF", SGD, workers=4, mode="grad"),
    row("w4-sgd-local-ef", "", "local, server EF", SGD, workers=4, mode="local"),
    row("w4-sgd-local-none", "", "local, server none", SGD, workers=4, mode="local",
        server="none"),
]


def table(names, seeds, data) -> None:
    """Runs the named rows (all when names is empty) and prints a markdown table."""
    chosen = [r for r in ROWS if not names or r[0] in names]
    for r in chosen:
        check(r[3])
    seed_list = ",".join(map(str, seeds))
    print(f"| optimizer, lr | scheme | acc % (seeds {seed_list}) | per seed | row |")
    print("|---|---|---|---|---|")
    group_of, last = {}, ""
    for name, group, _, _ in ROWS:  # a row with no group belongs to the one above it
        last = group_of[name] = group or last
    shown = ""
    for name, _, scheme, s in chosen:
        group = group_of[name] if group_of[name] != shown else ""
        shown = group_of[name]
        t0 = time.perf_counter()
        accs = runs(s, seeds, data)
        print(f"  {name}: {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
        per_seed = ", ".join(f"{a:.1f}" for a in accs)
        print(f"| {group} | {scheme} | {mean_sd(accs)} | {per_seed} | `{name}` |", flush=True)


def main() -> None:
    defaults = Settings()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--opt", choices=["sgd", "adam"], default=defaults.opt)
    ap.add_argument("--lr", type=float, default=None, help="default: 0.1 for SGD, 1e-2 for Adam")
    ap.add_argument("--mu", type=float, default=defaults.mu, help="SGD momentum")
    ap.add_argument("--mode", choices=list(STEPS), default=defaults.mode)
    ap.add_argument("--server", choices=["ef", "none"], default=defaults.server,
                    help="ef: re-encode the sum with onebit and the server's EF; none: float32")
    ap.add_argument("--no-worker-ef", action="store_true",
                    help="the worker pushes onebit of x itself (scaled sign, no residual)")
    ap.add_argument("--scale", choices=["l1", "l2"], default=defaults.scale,
                    help="onebit's scale: l1 = mean |p| (pushpull), l2 = ||p||_2/sqrt(n)")
    ap.add_argument("--adam-m", choices=["comp", "true"], default=defaults.adam_m,
                    help="grad mode with Adam: feed m the compressed or the true gradient")
    ap.add_argument("--adam-v", choices=["comp", "true"], default=defaults.adam_v,
                    help="grad mode with Adam: feed v the compressed or the true gradient")
    ap.add_argument("--workers", type=int, default=defaults.workers)
    ap.add_argument("--epochs", type=int, default=defaults.epochs)
    ap.add_argument("--seeds", default="0,1,2", help="comma-separated; prints mean ± sample sd")
    ap.add_argument("--table", nargs="?", const="", metavar="ROW,...",
                    help="run the table's rows (all, or the named ones) and print markdown")
    ap.add_argument("--list", action="store_true", help="print the table's row names")
    a = ap.parse_args()
    try:
        seeds = [int(x) for x in a.seeds.split(",")]
    except ValueError:
        ap.error(f"--seeds wants comma-separated integers, got {a.seeds!r}")
    torch.set_num_threads(1)
    if a.list:
        for name, group, scheme, _ in ROWS:
            print(f"{name:22} {group or '':16} {scheme}")
        return
    if a.table is not None:
        names = [n for n in a.table.split(",") if n]
        unknown = sorted(set(names) - {r[0] for r in ROWS})
        if unknown:
            ap.error(f"unknown rows {', '.join(unknown)} (see --list)")
        table(names, seeds, digits())
        return
    lr = a.lr if a.lr is not None else (0.1 if a.opt == "sgd" else 1e-2)
    s = Settings(opt=a.opt, lr=lr, mu=a.mu, mode=a.mode, server=a.server,
                 worker_ef=not a.no_worker_ef, scale=a.scale, adam_m=a.adam_m, adam_v=a.adam_v,
                 workers=a.workers, epochs=a.epochs)
    try:
        check(s)
    except ValueError as e:
        ap.error(str(e))
    accs = runs(s, seeds, digits())
    print(f"{s}: accs {', '.join(f'{x:.1f}' for x in accs)}, {mean_sd(accs)}")


if __name__ == "__main__":
    main()
