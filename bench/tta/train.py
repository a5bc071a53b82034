"""One worker of a time-to-accuracy run: the same model, data, optimizer and schedule
for every system, gradients exchanged through pushpull or through torch DDP on gloo; rank 0
writes validation bits per byte against the training clock as JSON lines.

Run it once per worker:

    # pushpull: the launcher starts a scheduler, servers, and this script once per worker
    pushpull local --workers 2 -- python bench/tta/train.py --system pushpull:onebit \\
        --workload transformer --steps 300 --eval-every 50 --out run.jsonl
    # torch DDP on gloo: one process per rank, RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set
    RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 python bench/tta/train.py \\
        --system ddp:powersgd:4 --workload transformer --steps 300 --eval-every 50 --out run.jsonl

Systems (``--system``):

* ``pushpull:PRESET``: ``pushpull.torch`` (``bps.init()``, ``bps.broadcast_parameters`` of rank
  0's state dict, ``bps.DistributedOptimizer(opt, model.named_parameters(),
  compression_params=MAP, warmup_steps=max(2, steps // 5), warmup_compression="fp16")``),
  MAP from :data:`PUSHPULL_PRESETS` (the warm-up matters where ``average="auto"`` takes
  ``"momentum"``: onebit and top-k under the transformer's AdamW; a fifth of the steps, past
  the learning rate's warm-up, as DeepSpeed's 1-bit Adam warms up for 15-25 %: onebit with 4
  workers then ends 1.0 % above DDP fp32, BENCHMARKS.md "Final quality of every preset, both
  workloads"; its gradients travel as fp16, as DDP's ``fp16_compress_hook`` sends them, in
  half the bytes of float32). None of the maps adds momentum on the worker
  (``DistributedOptimizer`` refuses worker momentum for an optimizer with momentum of its
  own, and both workloads' optimizers have it).
* ``pushpull:powersgd:R``: the same, with PowerSGD at rank R and ``ddp:powersgd:R``'s
  settings (:func:`powersgd_map`): pushpull's own PowerSGD through its servers, beside
  torch's hook.
* ``ddp:HOOK``: torch's ``DistributedDataParallel`` on gloo (``init_method="env://"``), with
  the communication hook HOOK: ``none`` (torch's ``allreduce_hook``, which its docstring says
  gives the same results as registering no hook), ``fp16`` (``fp16_compress_hook``),
  ``powersgd:R`` (``powerSGD_hook``, ``PowerSGDState(process_group=None,
  matrix_approximation_rank=R, start_powerSGD_iter=max(2, steps // 10))``), ``noop`` (hands the
  bucket back untouched: a step without communication, for sizing; the ranks then drift apart).
  When MASTER_ADDR is a loopback address and GLOO_SOCKET_IFNAME is unset, it is set to ``lo``.

Every system: ``torch.set_num_threads(1)``; the model made from ``--seed`` (and rank 0's copy
broadcast); each rank's batches drawn from ``(seed, step, rank)`` (``corpus.train_batch``); the
workload's optimizer, learning rate schedule and gradient clipping (after averaging), with no
per-system setting.

Every ``--eval-every`` steps (and at step 0 and at the last step) every rank stops its clock
and waits at a barrier; rank 0 evaluates the validation bits per byte on a fixed set of
windows; rank 0's decision to stop is broadcast (a second barrier); the clocks start again.
The training clock (``wall_s``) therefore excludes evaluation and both barriers. The run stops
after ``--steps`` steps, at the first evaluation at or below ``--target-bpb``, or at the first
evaluation whose training clock passed ``--time-limit`` seconds (the target not reached).

``--out FILE`` (rank 0 only) gets one JSON object per line:

* first, ``"kind": "run"``: the system and its map or hook, the workload (size fields,
  ``params``, ``grad_bytes``), the corpus's description, seeds, world size, steps, versions,
  and ``setup_s`` (process start to the first step: reading the corpus, joining the job, the
  initial broadcast);
* per evaluation, ``"kind": "eval"``: ``step``, ``wall_s``, ``val_bpb``, ``train_loss`` (rank
  0's mean training loss in nats over the steps since the previous line; null at step 0),
  ``lr`` (of the last step), ``cpu_s_per_step`` (this process's CPU time, all threads, per step
  since the previous line, evaluation excluded), ``bytes_per_step`` and ``raw_bytes_per_step``
  (per step since the previous line: pushpull, this worker's gradient bytes pushed and their
  float32 size, from ``bps.metrics()``, with ``bytes_pulled_per_step``; DDP, the bytes of the
  tensors the hook all-reduced (counted by wrapping ``torch.distributed.all_reduce``, which the
  hooks call) and the bytes of the buckets handed to the hook (counted by a wrapping hook)),
  and ``eval_s`` (the evaluation's seconds, not on the clock);
* last, ``"kind": "end"``: ``reached`` (whether ``--target-bpb`` was reached), ``step``,
  ``wall_s``, ``val_bpb``, ``target_bpb``, ``stopped`` (``target``, ``time_limit`` or
  ``steps``: what ended the run) and ``time_limit_s``.

Two options only inform and exit 0, before anything starts (for ``pushpull bench train``, which
validates its systems against this file's lists): ``--list-systems`` prints one JSON object,
``{"pushpull": [presets], "ddp": [hooks]}`` (a hook ``NAME:R`` takes a whole number R >= 1), and
``--check`` parses the whole command line as a run would, imports the system's packages
(torch; ``pushpull.torch`` for pushpull; gloo for DDP) and prints one JSON object
(``system``, ``workload``, ``size_name``, ``size``).

A failure raises an exception whose message names the rank (the process exits non-zero).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

# The compression maps of `--system pushpull:PRESET`, BytePS's string-map form. They are those
# of bench/torch_ddp.py's PRESETS of the same names (no worker momentum).
PUSHPULL_PRESETS: Dict[str, Dict[str, str]] = {
    "none": {},
    "fp16": {"byteps_compressor_type": "fp16"},
    "onebit": {"byteps_compressor_type": "onebit", "byteps_compressor_onebit_scaling": "true",
               "byteps_ef_type": "vanilla"},
    "topk": {"byteps_compressor_type": "topk", "byteps_compressor_k": "0.01",
             "byteps_ef_type": "vanilla"},
    "dithering": {"byteps_compressor_type": "dithering", "byteps_compressor_k": "15",
                  "bucket": "512"},
}
DDP_HOOKS = ("none", "fp16", "powersgd:R", "noop")
# The presets of `--system pushpull:PRESET`: the maps above, and PowerSGD at rank R
# (:func:`powersgd_map`, the settings of `ddp:powersgd:R`).
PUSHPULL_SYSTEMS = (*PUSHPULL_PRESETS, "powersgd:R")


def start_powersgd(steps: int) -> int:
    """PowerSGD's uncompressed steps, for torch's hook and pushpull's alike."""
    return max(2, steps // 10)


def powersgd_map(rank: int, steps: int) -> Dict[str, str]:
    """``pushpull:powersgd:R``'s map: torch's ``PowerSGDState`` settings of ``ddp:powersgd:R``
    (rank R, :func:`start_powersgd`, the defaults otherwise; DistributedOptimizer fills in
    each tensor's ``rows``)."""
    return {"compressor": "powersgd", "rank": str(rank), "start_iter": str(start_powersgd(steps))}


def parse_system(text: str) -> Tuple[str, str, int]:
    """``pushpull:PRESET`` or ``ddp:HOOK`` as ``(kind, name, rank)`` (``rank`` is PowerSGD's
    R, else 0); raises ``argparse.ArgumentTypeError`` naming the value and the allowed ones."""
    kind, _, rest = text.partition(":")
    if kind == "pushpull":
        if rest in PUSHPULL_PRESETS:
            return kind, rest, 0
        preset, _, r = rest.partition(":")
        if preset == "powersgd" and r.isdigit() and int(r) >= 1:
            return kind, preset, int(r)
        raise argparse.ArgumentTypeError(
            f"unknown pushpull preset {rest!r} in {text!r}: one of "
            f"{', '.join(PUSHPULL_SYSTEMS)} (R a whole number >= 1)")
    if kind == "ddp":
        if rest in ("none", "fp16", "noop"):
            return kind, rest, 0
        hook, _, r = rest.partition(":")
        if hook == "powersgd" and r.isdigit() and int(r) >= 1:
            return kind, hook, int(r)
        raise argparse.ArgumentTypeError(
            f"unknown ddp hook {rest!r} in {text!r}: one of {', '.join(DDP_HOOKS)} "
            "(R a whole number >= 1)")
    raise argparse.ArgumentTypeError(
        f"unknown system {text!r}: pushpull:PRESET (PRESET one of "
        f"{', '.join(PUSHPULL_SYSTEMS)}) or ddp:HOOK (HOOK one of {', '.join(DDP_HOOKS)})")


class ListSystems(argparse.Action):
    """``--list-systems``: prints the systems as JSON and exits 0, whatever else is given."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        print(json.dumps({"pushpull": list(PUSHPULL_SYSTEMS), "ddp": list(DDP_HOOKS)}),
              flush=True)
        parser.exit(0)


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    """The command line; every refusal (unknown system, workload, size or size field, bad
    numbers) is an argparse error, before anything starts."""
    import models

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--list-systems", action=ListSystems,
                   help="print the presets and hooks as JSON and exit")
    p.add_argument("--check", action="store_true",
                   help="parse the command line, import the system's packages, print the "
                   "run's settings as JSON and exit")
    p.add_argument("--system", type=parse_system, required=True,
                   help="pushpull:PRESET (none, fp16, onebit, topk, dithering, powersgd:R) or "
                   "ddp:HOOK (none, fp16, powersgd:R, noop)")
    p.add_argument("--workload", choices=models.WORKLOADS, required=True)
    p.add_argument("--size", default="default", help="a named size of the workload (default, "
                   "tiny; see models.SIZES)")
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                   help="override one field of the size (repeatable), e.g. --set d_model=128")
    p.add_argument("--steps", type=int, required=True, help="training steps at most (the "
                   "schedule's length)")
    p.add_argument("--eval-every", type=int, default=50, help="steps between evaluations")
    p.add_argument("--target-bpb", type=float, default=None,
                   help="stop at the first evaluation at or below this validation bits/byte")
    p.add_argument("--time-limit", type=float, default=None, metavar="S",
                   help="stop at the first evaluation whose training clock passed S seconds "
                   "(recorded as not reached)")
    p.add_argument("--val-windows", type=int, default=64,
                   help="validation windows of seq_len bytes (default 64)")
    p.add_argument("--val-seed", type=int, default=0,
                   help="seed of the validation windows (default 0, whatever --seed is)")
    p.add_argument("--seed", type=int, default=0, help="model initialisation and data order")
    p.add_argument("--bucket-mb", type=float, default=25.0,
                   help="gradient bucket size in MiB, DDP's bucket_cap_mb and "
                   "DistributedOptimizer's (default 25, both defaults)")
    p.add_argument("--out", required=True, help="JSON lines file (written by rank 0)")
    a = p.parse_args(argv)
    a.kind, a.name, a.powersgd_rank = a.system
    a.system = a.kind + ":" + a.name + (f":{a.powersgd_rank}" if a.name == "powersgd" else "")
    for name in ("steps", "eval_every", "val_windows"):
        if getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if a.seed < 0 or a.val_seed < 0:
        p.error("--seed and --val-seed must be >= 0")
    if not a.bucket_mb > 0:
        p.error("--bucket-mb must be > 0")
    if a.time_limit is not None and not (a.time_limit > 0 and math.isfinite(a.time_limit)):
        p.error("--time-limit must be a positive number of seconds")
    try:
        a.size_fields = models.size_of(a.workload, a.size, models.parse_overrides(a.set))
    except ValueError as e:
        p.error(str(e))
    if a.size_fields.warmup >= a.steps:
        p.error(f"--steps {a.steps} must exceed the size's warm-up of {a.size_fields.warmup} "
                "steps (--set warmup=N)")
    return a


# --- the systems ----------------------------------------------------------------------------


class PushPullSystem:
    """Gradients averaged by ``pushpull.torch.DistributedOptimizer`` with a preset's map."""

    def __init__(self, preset: str, powersgd_rank: int, steps: int, bucket_mb: float):
        import pushpull
        import pushpull.torch as bps

        self.bps = bps
        self.build_profile = pushpull.BUILD_PROFILE
        self.preset = preset if preset != "powersgd" else f"powersgd:{powersgd_rank}"
        self.map = (powersgd_map(powersgd_rank, steps) if preset == "powersgd"
                    else dict(PUSHPULL_PRESETS[preset]))
        self.bucket_mb = bucket_mb
        self.warmup_steps = max(2, steps // 5)
        self.warmup_compression = "fp16"
        bps.init()
        self.rank, self.world = bps.rank(), bps.size()
        if self.rank == 0 and self.build_profile != "release":
            print(f"train.py: warning: pushpull's extension is a {self.build_profile} build "
                  "(its compressors run several times slower); measure with a release build "
                  "(pip install ./python)", file=sys.stderr, flush=True)
        self.opt = None

    def describe(self) -> Dict[str, object]:
        """The preset and its compression map."""
        return {"preset": self.preset, "compression_params": self.map,
                "bucket_mb": self.bucket_mb, "average": self.opt._average if self.opt else None,
                "warmup_steps": self.warmup_steps,
                "warmup_compression": self.warmup_compression,
                "build_profile": self.build_profile}

    def wrap(self, model, opt):
        """Broadcasts rank 0's parameters and wraps ``opt``; returns the module to train."""
        self.bps.broadcast_parameters(model.state_dict(), root_rank=0)
        self.opt = self.bps.DistributedOptimizer(
            opt, model.named_parameters(), compression_params=self.map,
            bucket_cap_mb=self.bucket_mb, warmup_steps=self.warmup_steps,
            warmup_compression=self.warmup_compression)
        return model

    def step(self, module, params, loss_fn, clip: float) -> float:
        """One step: forward, backward (buckets start as gradients are ready), the averaged
        gradients clipped to ``clip`` (if > 0), the optimizer's step. Returns the loss."""
        opt = self.opt
        opt.zero_grad()
        loss = loss_fn(module)
        loss.backward()
        if clip > 0:
            opt.synchronize()
            import torch

            torch.nn.utils.clip_grad_norm_(params, clip)
            with opt.skip_synchronize():
                opt.step()
        else:
            opt.step()
        return loss.item()

    @property
    def param_groups(self):
        """The wrapped optimizer's parameter groups (for the learning rate)."""
        return self.opt.param_groups

    def barrier(self) -> None:
        """Every worker waits for the others."""
        self.bps.barrier()

    def broadcast_flag(self, value: float) -> float:
        """Rank 0's ``value`` on every rank."""
        import torch

        t = torch.tensor([value], dtype=torch.float32)
        return float(self.bps.broadcast(t, root_rank=0, name="tta.stop").item())

    def counters(self) -> Dict[str, int]:
        """Totals so far over the gradient tensors: bytes pushed, pulled, and their float32
        size (``bps.metrics()``)."""
        m = self.bps.metrics()
        out = {"bytes": 0, "pulled": 0, "raw": 0}
        for name, t in m["tensors"].items():
            if name.startswith("Gradient."):
                out["bytes"] += t["bytes_pushed"]
                out["pulled"] += t.get("bytes_pulled", 0)
                out["raw"] += t["raw_bytes"]
        return out

    def close(self) -> None:
        """Leaves the job."""
        self.bps.shutdown()


class DDPSystem:
    """Gradients averaged by torch's ``DistributedDataParallel`` on gloo with a hook."""

    def __init__(self, hook: str, powersgd_rank: int, steps: int, bucket_mb: float):
        import torch.distributed as dist

        self.dist = dist
        self.hook = hook
        self.powersgd_rank = powersgd_rank
        self.steps = steps
        self.bucket_mb = bucket_mb
        addr = os.environ.get("MASTER_ADDR", "")
        if addr in ("127.0.0.1", "localhost", "::1") and "GLOO_SOCKET_IFNAME" not in os.environ:
            os.environ["GLOO_SOCKET_IFNAME"] = "lo"
        dist.init_process_group("gloo", init_method="env://")
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.allreduced = 0  # bytes of the tensors the hooks all-reduced
        self.bucket_bytes = 0  # bytes of the buckets handed to the hook
        self._all_reduce = dist.all_reduce
        self.start_powersgd = start_powersgd(steps)
        self.opt = None

    def describe(self) -> Dict[str, object]:
        """The hook (and PowerSGD's settings)."""
        d: Dict[str, object] = {"hook": self.hook, "backend": "gloo",
                                "bucket_mb": self.bucket_mb}
        if self.hook == "powersgd":
            d.update(matrix_approximation_rank=self.powersgd_rank,
                     start_powerSGD_iter=self.start_powersgd)
        return d

    def _counting_all_reduce(self, tensor, *args, **kwargs):
        self.allreduced += tensor.numel() * tensor.element_size()
        return self._all_reduce(tensor, *args, **kwargs)

    def wrap(self, model, opt):
        """Wraps ``model`` in DDP (which broadcasts rank 0's parameters) with the hook, counted;
        returns the DDP module."""
        import torch
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
        from torch.nn.parallel import DistributedDataParallel as DDP

        self.opt = opt
        ddp = DDP(model, bucket_cap_mb=self.bucket_mb)  # the models have no buffers
        # The hooks call torch.distributed.all_reduce through the module at call time
        # (default_hooks.py, powerSGD_hook.py), so this wrapper sees every tensor they send.
        self.dist.all_reduce = self._counting_all_reduce
        if self.hook == "none":
            state, inner = None, default_hooks.allreduce_hook
        elif self.hook == "fp16":
            state, inner = None, default_hooks.fp16_compress_hook
        elif self.hook == "powersgd":
            state = powerSGD_hook.PowerSGDState(
                process_group=None, matrix_approximation_rank=self.powersgd_rank,
                start_powerSGD_iter=self.start_powersgd)
            inner = powerSGD_hook.powerSGD_hook
        else:  # noop
            state = None

            def inner(_state, bucket):
                fut = torch.futures.Future()
                fut.set_result(bucket.buffer())
                return fut

        def counted(st, bucket):
            buf = bucket.buffer()
            self.bucket_bytes += buf.numel() * buf.element_size()
            return inner(st, bucket)

        ddp.register_comm_hook(state, counted)
        return ddp

    def step(self, module, params, loss_fn, clip: float) -> float:
        """One step: forward, backward (DDP's buckets all-reduced through the hook as they
        fill), the averaged gradients clipped to ``clip`` (if > 0), the optimizer's step.
        Returns the loss."""
        import torch

        self.opt.zero_grad()
        loss = loss_fn(module)
        loss.backward()
        if clip > 0:
            torch.nn.utils.clip_grad_norm_(params, clip)
        self.opt.step()
        return loss.item()

    @property
    def param_groups(self):
        """The optimizer's parameter groups (for the learning rate)."""
        return self.opt.param_groups

    def barrier(self) -> None:
        """Every rank waits for the others."""
        self.dist.barrier()

    def broadcast_flag(self, value: float) -> float:
        """Rank 0's ``value`` on every rank."""
        import torch

        t = torch.tensor([value], dtype=torch.float32)
        self.dist.broadcast(t, src=0)
        return float(t.item())

    def counters(self) -> Dict[str, int]:
        """Totals so far: bytes all-reduced by the hook and bytes of the buckets."""
        return {"bytes": self.allreduced, "raw": self.bucket_bytes}

    def close(self) -> None:
        """Leaves the process group."""
        self.dist.all_reduce = self._all_reduce
        self.dist.destroy_process_group()


# --- the run --------------------------------------------------------------------------------


def evaluate(model, windows, batch: int) -> float:
    """Validation bits per byte of ``model`` on ``windows`` (inputs, targets): the mean
    cross-entropy in nats over every predicted byte, divided by ln 2."""
    import torch
    import models

    x, y = windows
    total, count = 0.0, 0
    was_training = model.training
    model.eval()
    with torch.no_grad():
        for i in range(0, len(x), batch):
            xb, yb = x[i:i + batch], y[i:i + batch]
            total += models.loss_of(model, xb, yb).item() * yb.numel()
            count += yb.numel()
    model.train(was_training)
    return total / count / math.log(2)


def run(a: argparse.Namespace, started: float) -> bool:
    """Trains as the module's description says; returns whether the target was reached."""
    import torch
    import corpus
    import models

    torch.set_num_threads(1)
    s = a.size_fields
    corpus.load()
    if a.kind == "pushpull":
        system = PushPullSystem(a.name, a.powersgd_rank, a.steps, a.bucket_mb)
    else:
        system = DDPSystem(a.name, a.powersgd_rank, a.steps, a.bucket_mb)
    rank, world = system.rank, system.world
    a.rank = rank
    model = models.make_model(a.workload, s, a.seed)
    params = list(model.parameters())
    opt = models.make_optimizer(a.workload, model, s)
    module = system.wrap(model, opt)
    val = corpus.val_windows(a.val_seed, a.val_windows, s.seq_len) if rank == 0 else None
    out = open(a.out, "w", encoding="utf-8") if rank == 0 else None

    def write(obj: Dict[str, object]) -> None:
        out.write(json.dumps(obj) + "\n")
        out.flush()

    system.barrier()
    setup_s = time.perf_counter() - started
    workload = models.describe(a.workload, s, model)
    if rank == 0:
        print(f"{a.workload} ({a.size}): {workload['params']} parameters, "
              f"{workload['grad_bytes']} gradient bytes per step", flush=True)
        write({"kind": "run", "system": a.system, "system_params": system.describe(),
               **workload, "size_name": a.size, "corpus": corpus.describe(), "seed": a.seed,
               "val_seed": a.val_seed, "val_windows": a.val_windows, "world": world,
               "steps": a.steps, "eval_every": a.eval_every, "target_bpb": a.target_bpb,
               "time_limit_s": a.time_limit, "threads": torch.get_num_threads(),
               "torch": torch.__version__, "python": platform.python_version(),
               "setup_s": setup_s})

    clock = cpu = 0.0
    mark = {"step": 0, "cpu": 0.0, "counters": system.counters(), "losses": []}
    last_bpb: Optional[float] = None
    lr = s.lr

    def checkpoint(step: int) -> str:
        """The evaluation, off the clock; returns why to stop (rank 0's decision: ``target``,
        ``time_limit``), or "" to go on."""
        nonlocal last_bpb
        system.barrier()
        stop = 0.0
        if rank == 0:
            t0 = time.perf_counter()
            bpb = evaluate(model, val, max(1, s.batch))
            eval_s = time.perf_counter() - t0
            n = step - mark["step"]
            now = system.counters()
            per = lambda k: (now[k] - mark["counters"][k]) / n if n else None  # noqa: E731
            line = {"kind": "eval", "step": step, "wall_s": clock, "val_bpb": bpb,
                    "train_loss": (sum(mark["losses"]) / n) if n else None, "lr": lr,
                    "cpu_s_per_step": (cpu - mark["cpu"]) / n if n else None,
                    "bytes_per_step": per("bytes"), "raw_bytes_per_step": per("raw")}
            if "pulled" in now:
                line["bytes_pulled_per_step"] = per("pulled")
            line["eval_s"] = eval_s
            write(line)
            mark.update(step=step, cpu=cpu, counters=now, losses=[])
            last_bpb = bpb
            if a.target_bpb is not None and bpb <= a.target_bpb:
                stop = 1.0
            elif a.time_limit is not None and clock > a.time_limit:
                stop = 2.0
        return {1.0: "target", 2.0: "time_limit"}.get(system.broadcast_flag(stop), "")

    stopped = checkpoint(0)
    step = 0
    while not stopped and step < a.steps:
        t0, c0 = time.perf_counter(), time.process_time()
        lr = models.lr_at(a.workload, s, step, a.steps)
        for group in system.param_groups:
            group["lr"] = lr
        x, y = corpus.train_batch(a.seed, step, rank, s.batch, s.seq_len)
        loss = system.step(module, params, lambda m: models.loss_of(m, x, y), s.clip)
        clock += time.perf_counter() - t0
        cpu += time.process_time() - c0
        if not math.isfinite(loss):
            raise FloatingPointError(f"training loss {loss} at step {step}")
        step += 1
        mark["losses"].append(loss)
        if step % a.eval_every == 0 or step == a.steps:
            stopped = checkpoint(step)
    reached = stopped == "target"
    if rank == 0:
        write({"kind": "end", "reached": reached, "step": step, "wall_s": clock,
               "val_bpb": last_bpb, "target_bpb": a.target_bpb, "stopped": stopped or "steps",
               "time_limit_s": a.time_limit})
        out.close()
    system.close()
    return reached


def check(a: argparse.Namespace) -> None:
    """``--check``: imports what the system needs and prints the run's settings."""
    import dataclasses

    import torch  # noqa: F401

    if a.kind == "pushpull":
        import pushpull.torch  # noqa: F401
    else:
        import torch.distributed as dist

        if not dist.is_gloo_available():
            raise RuntimeError("this torch has no gloo backend")
    print(json.dumps({"system": a.system, "workload": a.workload, "size_name": a.size,
                      "size": dataclasses.asdict(a.size_fields)}), flush=True)


def main(argv: Optional[List[str]] = None) -> int:
    """Parses the command line and runs one worker; any failure is raised again naming the
    rank (the launcher's or torch's environment's before the job is joined)."""
    started = time.perf_counter()
    a = parse_args(argv)
    if a.check:
        check(a)
        return 0
    a.rank = None
    try:
        run(a, started)
    except BaseException as e:
        if isinstance(e, (KeyboardInterrupt, SystemExit)):
            raise
        rank = a.rank if a.rank is not None else _env_rank()
        raise RuntimeError(f"rank {rank} ({a.system}, {a.workload}): "
                           f"{type(e).__name__}: {e}") from e
    return 0


def _env_rank() -> str:
    """This worker's rank as its environment gives it, before the job is joined."""
    if "RANK" in os.environ:
        return os.environ["RANK"]
    if "DMLC_WORKER_ID" in os.environ:
        size = int(os.environ.get("BYTEPS_LOCAL_SIZE", "1") or 1)
        local = int(os.environ.get("BYTEPS_LOCAL_RANK", "0") or 0)
        return str(int(os.environ["DMLC_WORKER_ID"]) * size + local)
    return "unknown"


if __name__ == "__main__":
    sys.exit(main())
