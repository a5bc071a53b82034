"""pushpull's round on the time-to-accuracy workloads, simulated in one process (W workers, no
network), so each part can be switched on or off: which is averaged (``--mode gradients``:
``DistributedOptimizer(average="gradients")``; ``updates``: ``average="updates"``; ``none``: float32 gradients),
onebit with error feedback on the workers (one scale, mean |x| or ‖x‖₂/√n, per ``--chunk``
elements, as ``cluster.partition_bytes`` cuts them), the servers' re-encode of the sum with its
own error feedback (``--server ef``) or the sum pulled as float32 (``none``), the first
``--warmup`` steps uncompressed, or the first ``--gwarm`` steps' gradients averaged
uncompressed before the updates; ``--mode frozen``: ``average="momentum"`` (DeepSpeed's
1-bit Adam: ``--gwarm`` steps of uncompressed gradients, then each worker's first moment
pushed and averaged, the second moment frozen); ``--mode sgdm``: the same for SGD with
momentum (each worker's heavy-ball buffer pushed and averaged, the step taken from it).
Tensors under 64 KiB travel as float32, as pushpull's
``min_compress_bytes``. Prints the validation bits per byte every 100 steps and a JSON line
at the end (BENCHMARKS.md "Onebit with the user's AdamW, through the cluster", measured at
a731cfb)::

    python bench/tta/simulate.py --workload transformer --mode updates --server none
"""
import argparse
import copy
import json
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import torch  # noqa: E402

import corpus  # noqa: E402
import models  # noqa: E402
from train import evaluate  # noqa: E402
p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
p.add_argument("--workload", choices=models.WORKLOADS, default="transformer")
p.add_argument("--steps", type=int, default=600)
p.add_argument("--mode", choices=["updates", "gradients", "none", "frozen", "sgdm"],
               default="updates")
p.add_argument("--server", choices=["ef", "none"], default="ef")
p.add_argument("--warmup", type=int, default=0)
p.add_argument("--workers", type=int, default=2)
p.add_argument("--chunk", type=int, default=32768)
p.add_argument("--scale", choices=["l1", "l2"], default="l1")
p.add_argument("--gwarm", type=int, default=0)
p.add_argument("--set", action="append", default=[])
a = p.parse_args()
torch.set_num_threads(1)
s = models.size_of(a.workload, "default", models.parse_overrides(a.set))
model = models.make_model(a.workload, s, 0)
val = corpus.val_windows(0, 64, s.seq_len)
W = a.workers
def onebit(x):
    out = torch.empty_like(x)
    f, o = x.reshape(-1), out.reshape(-1)
    for i in range(0, f.numel(), a.chunk):
        c = f[i:i+a.chunk]
        sc = c.abs().mean() if a.scale == "l1" else c.norm() / math.sqrt(c.numel())
        o[i:i+a.chunk] = torch.where(c < 0, -sc, sc)
    return out
small = lambda t: t.numel() * 4 < 65536
names = [n for n, _ in model.named_parameters()]
ew = [{n: torch.zeros_like(q) for n, q in model.named_parameters()} for _ in range(W)]
es = {n: torch.zeros_like(q) for n, q in model.named_parameters()}
def exchange(name, xs, compress):
    if not compress or small(xs[0]):
        acc = xs[0].clone()
        for x in xs[1:]: acc += x
        return acc / W
    acc = None
    for r, x in enumerate(xs):
        pp = x + ew[r][name]; c = onebit(pp); ew[r][name] = pp - c
        acc = c if acc is None else acc + c
    if a.server == "ef":
        pp = acc + es[name]; c = onebit(pp); es[name] = pp - c; acc = c
    return acc / W
opt = models.make_optimizer(a.workload, model, s)
if a.mode == "updates":
    copies = [copy.deepcopy(model) for _ in range(W)]
    opts = [models.make_optimizer(a.workload, c, s) for c in copies]
final_mode = a.mode
if final_mode in ("frozen", "sgdm"):
    a.mode = "gradients"  # until --gwarm
frozen = {}  # name -> (v_hat frozen at the end of the warm-up, weight decay)
momentum = {}  # name -> the averaged momentum every worker holds


def clipped_gradients(step):
    """Each worker's gradients of this step's batch on the shared model, each clipped to the
    size's ``clip`` on its own (by name)."""
    grads = []
    for r in range(W):
        model.zero_grad()
        x, y = corpus.train_batch(0, step, r, s.batch, s.seq_len)
        models.loss_of(model, x, y).backward()
        torch.nn.utils.clip_grad_norm_(list(model.parameters()), s.clip)
        grads.append({n: q.grad.clone() for n, q in model.named_parameters()})
    return grads


def frozen_step(step, lr, comp):
    """DeepSpeed's 1-bit Adam after its warm-up: the second moment frozen as the warm-up's
    (averaged-gradient) AdamW left it, every worker's momentum pushed (onebit with error
    feedback, as the gradients would be) and the average taken as everyone's momentum, the
    AdamW step taken from it."""
    b1, b2 = opt.param_groups[0]["betas"]
    eps = opt.param_groups[0]["eps"]
    if not frozen:
        for g in opt.param_groups:
            for q in g["params"]:
                st = opt.state[q]
                t = int(st["step"])
                n = name_of[id(q)]
                frozen[n] = (st["exp_avg_sq"] / (1 - b2 ** t), g["weight_decay"])
                momentum[n] = st["exp_avg"].clone()
    grads = clipped_gradients(step)
    t = step + 1
    with torch.no_grad():
        for n, q in model.named_parameters():
            ms = [b1 * momentum[n] + (1 - b1) * g[n] for g in grads]
            momentum[n] = exchange(n, ms, comp)
            v_hat, wd = frozen[n]
            q.mul_(1 - lr * wd)
            q.add_(-lr * (momentum[n] / (1 - b1 ** t)) / (v_hat.sqrt() + eps))


def sgdm_step(step, lr, comp):
    """Heavy-ball SGD's momentum averaged (torch's SGD, dampening 0, not Nesterov): every
    worker's buffer mu * m + (g + wd * p), from the averaged m every worker holds, pushed
    (onebit with error feedback) and the average taken as everyone's m; p <- p - lr * m."""
    g0 = opt.param_groups[0]
    mu, wd = g0["momentum"], g0["weight_decay"]
    if not momentum:
        for q in g0["params"]:
            buf = opt.state[q].get("momentum_buffer") if q in opt.state else None
            momentum[name_of[id(q)]] = buf.clone() if buf is not None else torch.zeros_like(q)
    grads = clipped_gradients(step)
    with torch.no_grad():
        for n, q in model.named_parameters():
            ms = [mu * momentum[n] + g[n] + wd * q for g in grads]
            momentum[n] = exchange(n, ms, comp)
            q.add_(momentum[n], alpha=-lr)


name_of = {id(q): n for n, q in model.named_parameters()}
t0 = time.time()
for step in range(a.steps):
    lr = models.lr_at(a.workload, s, step, a.steps)
    comp = a.mode != "none" and step >= max(a.warmup, a.gwarm)
    if final_mode == "updates":
        if step < a.gwarm:
            a.mode = "gradients"; comp = False
        elif step == a.gwarm and a.gwarm > 0:
            a.mode = "updates"
            for c, o in zip(copies, opts):
                o.load_state_dict(copy.deepcopy(opt.state_dict()))
    if final_mode == "frozen" and step >= a.gwarm:
        frozen_step(step, lr, comp)
    elif final_mode == "sgdm" and step >= a.gwarm:
        sgdm_step(step, lr, comp)
    elif a.mode == "updates":
        deltas = []
        for r in range(W):
            c, o = copies[r], opts[r]
            with torch.no_grad():
                for q, pp in zip(c.parameters(), model.parameters()): q.copy_(pp)
            for g in o.param_groups: g["lr"] = lr
            o.zero_grad()
            x, y = corpus.train_batch(0, step, r, s.batch, s.seq_len)
            models.loss_of(c, x, y).backward()
            torch.nn.utils.clip_grad_norm_(list(c.parameters()), s.clip)
            o.step()
            deltas.append({n: q.detach() - pp.detach() for (n, q), pp in zip(c.named_parameters(), model.parameters())})
        with torch.no_grad():
            for n, pp in model.named_parameters():
                pp.add_(exchange(n, [d[n] for d in deltas], comp))
    else:
        grads = []
        for r in range(W):
            model.zero_grad()
            x, y = corpus.train_batch(0, step, r, s.batch, s.seq_len)
            models.loss_of(model, x, y).backward()
            grads.append({n: q.grad.clone() for n, q in model.named_parameters()})
        for n, q in model.named_parameters():
            q.grad = exchange(n, [g[n] for g in grads], comp)
        torch.nn.utils.clip_grad_norm_(list(model.parameters()), s.clip)
        for g in opt.param_groups: g["lr"] = lr
        opt.step()
    if (step + 1) % 100 == 0:
        print(step + 1, round(evaluate(model, val, s.batch), 4), round(time.time() - t0), flush=True)
print(json.dumps({"args": {**vars(a), "mode": final_mode}, "bpb": evaluate(model, val, s.batch)}))
