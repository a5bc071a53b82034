"""Training throughput of one torchvision model: through pushpull, through torch's
DistributedDataParallel, or with no communication at all (the ceiling), by the same procedure.

One mode per run; `bench/torch_vs_ddp.py` runs all of them in one sitting and prints the table.
On a GPU machine (2 ranks sharing GPU 0; with several GPUs rank r uses GPU r % device_count):

    # pushpull: the launcher starts a scheduler and 2 servers on loopback and this script once per
    # rank (the environment `pushpull.torch.init()` reads)
    pushpull local --workers 2 -- python bench/torch_ddp.py --mode pushpull --compressor onebit
    # torch DDP: spawns its own 2 ranks (backend auto: gloo when ranks share a GPU, else nccl)
    python bench/torch_ddp.py --mode ddp --world 2
    # the ceiling: 2 ranks training the same model side by side, nothing exchanged
    python bench/torch_ddp.py --mode none --world 2

CPU smoke test (tiny images, 1 warm-up and 2 timed steps; seconds, not a measurement):

    pushpull local --workers 2 -- python bench/torch_ddp.py --mode pushpull --device cpu \\
        --model resnet18 --batch 2 --image 32 --warmup 1 --steps 2 --compressor onebit
    python bench/torch_ddp.py --mode ddp --world 2 --device cpu --model resnet18 --batch 2 \\
        --image 32 --warmup 1 --steps 2

The procedure, the same in every mode: model `--model` from torchvision (any name
`torchvision.models.get_model` knows; random weights, `--classes` outputs), one batch of random
inputs (`--batch` x 3 x `--image` x `--image`) and integer labels generated once on the device,
cross entropy, SGD with lr 0.01 and momentum 0.9 (momentum 0 when the compressor's map brings
momentum of its own), `cudnn.benchmark` on, TF32 for matmuls and convolutions per `--tf32`
(default on), `--warmup` untimed steps, a barrier of the ranks, then `--steps` timed steps with
`torch.cuda.synchronize()` before each of the two clock readings (none inside the steps).
img/s of a rank = batch x steps / seconds. With `--profile DIR`, 5 more steps run afterwards
under `torch.profiler` (CPU and CUDA activity) and each rank writes a Chrome trace
`DIR/MODE-rankR.json` (open it in Perfetto; the timed steps are not profiled).

Each rank prints one line, `BENCH {json}`: mode, rank, world, model, batch, image, compressor
and its map, img_per_s, seconds, device and its name, torch version, tf32; pushpull adds the
bytes pushed, pulled and their float32 size per timed step (deltas of `bps.metrics()` over the
timed steps), the seconds per step spent compressing, waiting and decompressing (the metrics'
sums over tensors, which overlap: not wall time), the worker's CUDA driver calls per step and
the GPU and page-locked bytes it holds, and for the gradient tensors how many were
compressed where (the metrics' per-tensor `device`) and with which codecs; ddp adds the
backend.

Modes:

* `pushpull`: one copy per rank under `pushpull local`; `bps.broadcast_parameters` of the
  state dict from rank 0, then `bps.DistributedOptimizer(opt, named_parameters=...,
  compression_params=MAP)`. `--compressor` picks MAP: none = {} (float32), fp16, bf16,
  onebit (scaling, vanilla error feedback), topk / randomk (k = 0.01, vanilla error
  feedback), dithering (k = 15, bucket 512), minmax (8 bits, bucket 512); `--params k=v,k=v`
  adds or replaces keys (alone, with `--compressor none`, it is the whole map).
* `ddp`: spawns `--world` ranks (torch.multiprocessing), `init_method` tcp on 127.0.0.1 (a free
  port, or `--port`), DDP with buckets of `--bucket-mb` MiB (default 25,
  DDP's and `DistributedOptimizer`'s). `--backend auto` takes nccl when every rank
  has a GPU of its own and gloo otherwise (NCCL refuses two ranks on one GPU) or on the CPU.
* `none`: spawns `--world` ranks that train without exchanging anything (a multiprocessing
  barrier aligns the start of the timed steps).

Loopback only: unless already set, GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME are `lo`.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import socket
import sys
import time

PRESETS = {
    "none": {},
    "fp16": {"compressor": "fp16"},
    "bf16": {"compressor": "bf16"},
    "onebit": {"compressor": "onebit", "scaling": "true", "ef": "vanilla"},
    "topk": {"compressor": "topk", "k": "0.01", "ef": "vanilla"},
    "randomk": {"compressor": "randomk", "k": "0.01", "ef": "vanilla"},
    "dithering": {"compressor": "dithering", "k": "15", "bucket": "512"},
    "dithering-elias": {"compressor": "dithering", "k": "4", "bucket": "512", "encoding": "elias"},
    "minmax": {"compressor": "minmax", "bits": "8", "bucket": "512"},
}
MOMENTUM_KEYS = ("momentum", "byteps_momentum_type")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--mode", choices=["pushpull", "ddp", "none"], required=True)
    p.add_argument("--model", default="resnet50", help="a torchvision.models name (default resnet50)")
    p.add_argument("--batch", type=int, default=32, help="images per rank per step (default 32)")
    p.add_argument("--image", type=int, default=224, help="image side in pixels (default 224)")
    p.add_argument("--classes", type=int, default=1000, help="classes of the model and labels")
    p.add_argument("--warmup", type=int, default=10, help="untimed steps first (default 10)")
    p.add_argument("--steps", type=int, default=30, help="timed steps (default 30)")
    p.add_argument("--tf32", choices=["on", "off"], default="on",
                   help="TF32 for float32 matmuls and convolutions (default on)")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                   help="cuda: rank r on GPU (local rank r) %% device_count (default)")
    p.add_argument("--compressor", choices=sorted(PRESETS), default="none",
                   help="pushpull: the gradients' parameter map (default none: float32)")
    p.add_argument("--params", default="",
                   help="pushpull: k=v,k=v keys added to (or replacing those of) the map")
    p.add_argument("--world", type=int, default=None,
                   help="ddp/none: ranks to spawn (default 2); pushpull: the launcher's "
                   "--workers decides (checked when given)")
    p.add_argument("--backend", choices=["auto", "gloo", "nccl"], default="auto", help="ddp")
    p.add_argument("--port", type=int, default=0, help="ddp: TCP port on 127.0.0.1 (0: a free one)")
    p.add_argument("--threads", type=int, default=0,
                   help="torch CPU threads per rank (0: cores / ranks, at least 1)")
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--momentum", type=float, default=0.9,
                   help="SGD momentum (0 is used when the compressor map has momentum)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--bucket-mb", type=float, default=25.0,
                   help="pushpull, ddp: gradient bucket size in MiB (DDP's bucket_cap_mb, "
                   "DistributedOptimizer's; default 25, both defaults)")
    p.add_argument("--no-fuse", action="store_true",
                   help="pushpull: DistributedOptimizer(fuse_small=False), every small gradient "
                   "its own round (the default packs a bucket's small ones into one)")
    p.add_argument("--ordered-step", action="store_true",
                   help="pushpull: DistributedOptimizer(ordered_step=True), step() queues the "
                   "optimizer behind the results on the GPU instead of waiting on the CPU")
    p.add_argument("--sync-after-backward", action="store_true",
                   help="the CPU waits for the GPU after each backward pass (torch.cuda."
                   "synchronize), as a blocking end of the gradients' exchange makes it do: "
                   "with --mode none, the ceiling without the CPU queueing ahead of the GPU")
    p.add_argument("--profile", default=None, metavar="DIR",
                   help="after the timed steps, profile 5 more (torch.profiler, CPU and CUDA) "
                   "and write DIR/MODE-rankR.json, a Chrome trace")
    a = p.parse_args(argv)
    for name in ("batch", "image", "classes", "steps"):
        if getattr(a, name) < 1:
            p.error(f"--{name} must be >= 1")
    if a.warmup < 0:
        p.error("--warmup must be >= 0")
    if not a.bucket_mb > 0:
        p.error("--bucket-mb must be > 0")
    if a.world is not None and a.world < 1:
        p.error("--world must be >= 1")
    try:
        a.param_map = compression_map(a.compressor, a.params)
    except ValueError as e:
        p.error(str(e))
    if a.mode != "pushpull" and (a.compressor != "none" or a.params):
        p.error(f"--compressor/--params are for --mode pushpull, not {a.mode}")
    return a


def compression_map(compressor: str, params: str) -> dict:
    """The preset of `compressor` with the `k=v,k=v` pairs of `params` on top."""
    m = dict(PRESETS[compressor])
    for item in filter(None, (s.strip() for s in params.split(","))):
        k, sep, v = item.partition("=")
        if not sep or not k.strip():
            raise ValueError(f"--params: {item!r} is not KEY=VALUE")
        m[k.strip()] = v.strip()
    return m


def map_has_momentum(m: dict) -> bool:
    return any(m.get(k, "none") not in ("", "none") for k in MOMENTUM_KEYS)


def compressor_label(a) -> str:
    if a.mode != "pushpull":
        return "-"
    return a.compressor + (f"+{a.params}" if a.params else "")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- one rank ----------------------------------------------------------------------------


def setup_torch(a, world: int):
    import torch

    threads = a.threads or max(1, (os.cpu_count() or 1) // world)
    torch.set_num_threads(threads)
    torch.backends.cudnn.benchmark = True
    tf32 = a.tf32 == "on"
    matmul = torch.backends.cuda.matmul
    if hasattr(matmul, "fp32_precision"):  # torch >= 2.9; the allow_tf32 flags are deprecated
        precision = "tf32" if tf32 else "ieee"
        matmul.fp32_precision = precision
        torch.backends.cudnn.conv.fp32_precision = precision
    else:
        matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32
    return threads


def pick_device(a, local_rank: int):
    import torch

    if a.device == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no CUDA GPU (torch.cuda.is_available() is False); "
                         "use --device cpu for a smoke test")
    dev = torch.device("cuda", local_rank % torch.cuda.device_count())
    torch.cuda.set_device(dev)
    return dev


def build(a, dev, rank: int):
    """The model, a fixed batch on the device, and the loss."""
    import torch
    import torchvision

    torch.manual_seed(a.seed)  # the same initial weights everywhere (pushpull and DDP broadcast anyway)
    model = torchvision.models.get_model(a.model, weights=None, num_classes=a.classes).to(dev)
    model.train()
    gen = torch.Generator(device=dev).manual_seed(a.seed * 1000 + rank + 1)
    x = torch.randn(a.batch, 3, a.image, a.image, device=dev, generator=gen)
    y = torch.randint(0, a.classes, (a.batch,), device=dev, generator=gen)
    return model, x, y


def logits(out):
    """The logits of a model's output (inception_v3 and googlenet return named tuples in training)."""
    import torch

    if isinstance(out, torch.Tensor):
        return out
    return out.logits if hasattr(out, "logits") else out[0]


def sync(dev) -> None:
    import torch

    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def run_steps(a, dev, model, opt, x, y, barrier, rank: int, timed_done=lambda: None):
    """Warm-up steps, the barrier, then the timed steps: returns their seconds; `timed_done`
    is called right after them (then, with `--profile`, 5 profiled steps run, untimed)."""
    import torch

    def step():
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(logits(model(x)), y)
        loss.backward()
        if a.sync_after_backward:
            sync(dev)
        opt.step()

    for _ in range(a.warmup):
        step()
    sync(dev)
    barrier()
    start = time.perf_counter()
    for _ in range(a.steps):
        step()
    sync(dev)
    seconds = time.perf_counter() - start
    timed_done()
    if a.profile:
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU]
        if dev.type == "cuda":
            activities.append(ProfilerActivity.CUDA)
        with profile(activities=activities) as prof:
            for _ in range(5):
                step()
            sync(dev)
        os.makedirs(a.profile, exist_ok=True)
        prof.export_chrome_trace(os.path.join(a.profile, f"{a.mode}-rank{rank}.json"))
    return seconds


def report(a, mode: str, rank: int, world: int, dev, seconds: float, threads: int, extra=None):
    import torch

    line = {
        "mode": mode,
        "rank": rank,
        "world": world,
        "model": a.model,
        "batch": a.batch,
        "bucket_mb": a.bucket_mb,
        "fuse_small": not a.no_fuse,
        "ordered_step": a.ordered_step,
        "image": a.image,
        "compressor": compressor_label(a),
        "params": a.param_map if mode == "pushpull" else None,
        "img_per_s": a.batch * a.steps / seconds,
        "seconds": seconds,
        "steps": a.steps,
        "warmup": a.warmup,
        "device": str(dev),
        "device_name": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "tf32": a.tf32,
        "threads": threads,
    }
    line.update(extra or {})
    print("BENCH " + json.dumps(line), flush=True)


def make_sgd(a, model, has_momentum: bool):
    import torch

    momentum = 0.0 if has_momentum else a.momentum
    return torch.optim.SGD(model.parameters(), lr=a.lr, momentum=momentum)


# --- pushpull ----------------------------------------------------------------------------


def run_pushpull(a) -> None:
    import torch

    import pushpull.torch as bps

    bps.init()
    rank, world = bps.rank(), bps.size()
    if a.world is not None and a.world != world:
        raise SystemExit(f"--world {a.world}, but the pushpull job has {world} workers")
    threads = setup_torch(a, world)
    dev = pick_device(a, bps.local_rank())
    model, x, y = build(a, dev, rank)
    bps.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = make_sgd(a, model, map_has_momentum(a.param_map))
    opt = bps.DistributedOptimizer(
        opt, named_parameters=model.named_parameters(), compression_params=a.param_map,
        bucket_cap_mb=a.bucket_mb, fuse_small=not a.no_fuse, ordered_step=a.ordered_step,
    )
    # A push_pull of one element: returns once every worker has pushed it.
    token = torch.zeros(1)

    def barrier():
        bps.push_pull_inplace(token, name="bench.barrier")

    state = {}

    def barrier_then_snapshot():
        barrier()
        state["before"] = bps.metrics()

    # The snapshot is taken before the clock starts (run_steps reads it right after barrier()).
    def snapshot_after():
        state["after"] = bps.metrics()

    seconds = run_steps(a, dev, model, opt, x, y, barrier_then_snapshot, rank, snapshot_after)
    before, after = state["before"], state["after"]
    per_step = lambda k: (after[k] - before[k]) / a.steps  # noqa: E731
    grads = {n: t for n, t in after["tensors"].items() if n.startswith("Gradient.")}
    codecs = collections.Counter(
        ",".join(sorted(set(t.get("codecs") or ["?"]))) for t in grads.values()
    )
    extra = {
        "bytes_pushed_per_step": per_step("bytes_pushed"),
        "bytes_pulled_per_step": per_step("bytes_pulled"),
        "raw_bytes_per_step": per_step("raw_bytes"),
        "compress_s_per_step": per_step("compress_seconds"),
        "wait_s_per_step": per_step("wait_seconds"),
        "decompress_s_per_step": per_step("decompress_seconds"),
        # CUDA driver calls of the worker's GPU rounds (a bucket is one batch: about a dozen).
        "driver_calls_per_step": per_step("driver_calls"),
        "device_bytes": after["device_bytes"],
        "gradient_tensors": len(grads),
        "compressed_on": dict(collections.Counter(t["device"] for t in grads.values())),
        "codecs": dict(codecs),
    }
    report(a, "pushpull", rank, world, dev, seconds, threads, extra)
    bps.shutdown()


# --- ddp and none: spawned ranks ---------------------------------------------------------


def ddp_backend(a, world: int) -> str:
    import torch

    if a.backend != "auto":
        return a.backend
    if a.device == "cuda" and torch.cuda.is_available() and torch.cuda.device_count() >= world:
        return "nccl"
    return "gloo"


def spawned_rank(rank: int, a, world: int, port: int, backend: str, start_barrier) -> None:
    import torch

    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    os.environ.setdefault("NCCL_SOCKET_IFNAME", "lo")
    threads = setup_torch(a, world)
    dev = pick_device(a, rank)
    model, x, y = build(a, dev, rank)
    extra = {}
    if a.mode == "ddp":
        import datetime

        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP

        dist.init_process_group(
            backend,
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=world,
            timeout=datetime.timedelta(seconds=300),
        )
        model = DDP(
            model,
            device_ids=[dev.index] if dev.type == "cuda" else None,
            bucket_cap_mb=a.bucket_mb,
        )
        if backend == "nccl":
            barrier = lambda: dist.barrier(device_ids=[dev.index])  # noqa: E731
        else:
            barrier = dist.barrier
        extra["backend"] = backend
    else:
        barrier = start_barrier.wait
    opt = make_sgd(a, model, False)
    seconds = run_steps(a, dev, model, opt, x, y, barrier, rank)
    report(a, a.mode, rank, world, dev, seconds, threads, extra)
    if a.mode == "ddp":
        import torch.distributed as dist

        dist.destroy_process_group()


def run_spawned(a) -> None:
    import torch.multiprocessing as mp

    world = a.world or 2
    backend = ddp_backend(a, world) if a.mode == "ddp" else None
    if backend == "nccl" and a.device == "cpu":
        raise SystemExit("--backend nccl needs --device cuda")
    port = a.port or free_port()
    ctx = mp.get_context("spawn")
    start_barrier = ctx.Barrier(world) if a.mode == "none" else None
    mp.start_processes(
        spawned_rank,
        args=(a, world, port, backend, start_barrier),
        nprocs=world,
        join=True,
        start_method="spawn",
    )


def main(argv=None) -> None:
    a = parse_args(argv)
    if a.mode == "pushpull":
        run_pushpull(a)
    else:
        run_spawned(a)


if __name__ == "__main__":
    sys.exit(main())
