"""pushpull against torch's DistributedDataParallel, in one sitting: training img/s of one
torchvision model with W ranks (default 2 sharing one GPU), for

* the ceiling: W ranks training side by side with no communication (`--mode none`); with
  `--synced-ceiling` also the same with the CPU waiting for the GPU after each backward pass,
* torch DDP (`--mode ddp`: gloo when ranks share a GPU, nccl when each has its own),
* pushpull, once per compressor of `--compressors` (default none,fp16,onebit), under
  `pushpull local --workers W` (a scheduler and servers on loopback),

each run by `bench/torch_ddp.py` with the same procedure (see its docstring), one after the
other. Prints a Markdown table: img/s per rank (mean over ranks, and the slowest and fastest
rank), the ratios pushpull / DDP and pushpull / ceiling, bytes pushed per rank per step and
where pushpull compressed the gradients; then the command lines. Exits non-zero, naming the
runs, when any run fails, prints no BENCH line per rank, or exceeds `--timeout` seconds (its
whole process group is killed). Each run's output is kept in `--logs` (default: a new temporary
folder, named at the start). Loopback only: no network needed.

On the GPU machine (an H100; the pushpull binaries and the wheel built elsewhere and copied
over: `pip install pushpull-*.whl` into the environment that has torch and torchvision):

    python bench/torch_vs_ddp.py --pushpull /path/to/pushpull
    # chunks made for loopback (4 MB) rather than slow links (BENCHMARKS.md, "PyTorch on a
    # GPU against torch DDP")
    python bench/torch_vs_ddp.py --pushpull /path/to/pushpull --config configs/gpu-local.toml
    # the same with a bigger model or several settings, e.g.
    python bench/torch_vs_ddp.py --pushpull /path/to/pushpull --model resnet101 \\
        --compressors none,fp16,onebit,topk --tf32 off --workers 2

CPU smoke test (tiny model and images, seconds per run; checks the plumbing, measures nothing):

    python bench/torch_vs_ddp.py --pushpull target/debug/pushpull --device cpu \\
        --model resnet18 --batch 2 --image 32 --warmup 1 --steps 2 --compressors none,onebit
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "torch_ddp.py")
BENCH = re.compile(r"BENCH (\{.*\})\s*$")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--pushpull", default="pushpull",
                   help="the pushpull launcher binary (default: `pushpull` on PATH)")
    p.add_argument("--python", default=sys.executable,
                   help="interpreter with torch, torchvision and pushpull (default: this one)")
    p.add_argument("--workers", type=int, default=2, help="ranks W in every run (default 2)")
    p.add_argument("--compressors", default="none,fp16,onebit",
                   help="pushpull runs, comma-separated torch_ddp.py --compressor names")
    p.add_argument("--params", default="",
                   help="k=v,k=v added to every pushpull run's map (torch_ddp.py --params)")
    p.add_argument("--skip", default="",
                   help="comma-separated runs to leave out: ceiling, ddp (the ratios to a "
                   "skipped run are left empty)")
    p.add_argument("--synced-ceiling", action="store_true",
                   help="also run the ceiling with the CPU waiting for the GPU after each "
                   "backward pass (torch_ddp.py --sync-after-backward), as a blocking end of "
                   "the exchange makes it wait: what the step loses when the CPU cannot queue "
                   "ahead")
    p.add_argument("--servers", type=int, default=None,
                   help="pushpull servers (default: the launcher's cluster file, 2)")
    p.add_argument("--config", default=None,
                   help="cluster file for `pushpull local --config` (e.g. a larger "
                   "cluster.partition_bytes)")
    p.add_argument("--timeout", type=float, default=600.0,
                   help="seconds each run may take, start-up included (default 600)")
    p.add_argument("--logs", default=None, help="folder for each run's output (default: a temp dir)")
    # Passed to every run of torch_ddp.py.
    p.add_argument("--model", default="resnet50")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--image", type=int, default=224)
    p.add_argument("--classes", type=int, default=1000)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--tf32", choices=["on", "off"], default="on")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--backend", choices=["auto", "gloo", "nccl"], default="auto", help="DDP's")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads per rank (0: auto)")
    p.add_argument("--bucket-mb", type=float, default=25.0,
                   help="bucket size of DDP and of pushpull's DistributedOptimizer (default 25)")
    p.add_argument("--no-fuse", action="store_true",
                   help="pushpull runs: every small gradient its own round (torch_ddp.py "
                   "--no-fuse)")
    p.add_argument("--ordered-step", choices=["off", "on", "both"], default="off",
                   help="pushpull runs: step() waits on the CPU (off), is ordered on the GPU "
                   "(on: torch_ddp.py --ordered-step), or each compressor both ways in turn")
    a = p.parse_args(argv)
    if a.workers < 1:
        p.error("--workers must be >= 1")
    a.compressor_list = [c.strip() for c in a.compressors.split(",") if c.strip()]
    a.skip_list = {s.strip() for s in a.skip.split(",") if s.strip()}
    sys.path.insert(0, HERE)
    from torch_ddp import PRESETS  # no torch import at module level

    unknown = [c for c in a.compressor_list if c not in PRESETS]
    if unknown:
        p.error(f"--compressors: unknown {unknown} (known: {', '.join(sorted(PRESETS))})")
    bad = a.skip_list - {"ceiling", "ddp"}
    if bad:
        p.error(f"--skip: unknown runs {sorted(bad)} (ceiling, ddp)")
    return a


def common_args(a) -> list:
    return [
        "--model", a.model, "--batch", str(a.batch), "--image", str(a.image),
        "--classes", str(a.classes), "--warmup", str(a.warmup), "--steps", str(a.steps),
        "--tf32", a.tf32, "--device", a.device, "--threads", str(a.threads),
        "--bucket-mb", str(a.bucket_mb),
    ]


def plan(a, pushpull: str) -> list:
    """(label, kind, command) of every run, in order."""
    runs = []
    py = [a.python, SCRIPT]
    if "ceiling" not in a.skip_list:
        runs.append(("ceiling (no communication)", "ceiling",
                     py + ["--mode", "none", "--world", str(a.workers)] + common_args(a)))
    if a.synced_ceiling:
        runs.append(("ceiling, CPU waits after backward", "synced",
                     py + ["--mode", "none", "--world", str(a.workers), "--sync-after-backward"]
                     + common_args(a)))
    if "ddp" not in a.skip_list:
        runs.append(("torch DDP", "ddp",
                     py + ["--mode", "ddp", "--world", str(a.workers), "--backend", a.backend]
                     + common_args(a)))
    launcher = [pushpull, "local", "--workers", str(a.workers)]
    if a.servers is not None:
        launcher += ["--servers", str(a.servers)]
    if a.config:
        launcher += ["--config", a.config]
    orders = {"off": [False], "on": [True], "both": [False, True]}[a.ordered_step]
    for c in a.compressor_list:
        for ordered in orders:
            cmd = launcher + ["--"] + py + ["--mode", "pushpull", "--compressor", c]
            cmd += common_args(a)
            if a.params:
                cmd += ["--params", a.params]
            if a.no_fuse:
                cmd += ["--no-fuse"]
            if ordered:
                cmd += ["--ordered-step"]
            label = f"pushpull {c}" + (f" +{a.params}" if a.params else "") + (
                " unfused" if a.no_fuse else "") + (" ordered" if ordered else "")
            runs.append((label, "pushpull", cmd))
    return runs


def run_one(label: str, cmd: list, timeout: float, log_path: str, workers: int):
    """Runs `cmd` in its own process group; returns (BENCH records, error or None, seconds)."""
    start = time.monotonic()
    with open(log_path, "w") as log:
        log.write("$ " + shlex.join(cmd) + "\n")
        log.flush()
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        error = None
        try:
            rc = proc.wait(timeout=timeout)
            if rc != 0:
                error = f"exited with status {rc}"
        except subprocess.TimeoutExpired:
            error = f"timed out after {timeout:.0f} s (killed)"
        finally:
            # The run's whole process group (the launcher's or spawn's children too).
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
    seconds = time.monotonic() - start
    records = []
    with open(log_path) as log:
        text = log.read()
    for line in text.splitlines():
        m = BENCH.search(line)
        if m:
            try:
                records.append(json.loads(m.group(1)))
            except json.JSONDecodeError:
                pass
    if error is None and len(records) != workers:
        error = f"printed {len(records)} BENCH lines, expected {workers} (one per rank)"
    if error is None:
        ranks = sorted(r.get("rank") for r in records)
        if ranks != list(range(workers)):
            error = f"BENCH lines of ranks {ranks}, expected 0..{workers - 1}"
    return records, error, seconds, text


def fmt(x, digits=1):
    return "" if x is None else f"{x:,.{digits}f}"


def ratio(x, y):
    return "" if x is None or not y else f"{x / y:.3f}"


def human_bytes(b):
    if b is None:
        return ""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if b >= scale:
            return f"{b / scale:.2f} {unit}"
    return f"{b:.0f} B"


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    a = parse_args(argv)
    pushpull = shutil.which(a.pushpull) if os.sep not in a.pushpull else a.pushpull
    if a.compressor_list and (pushpull is None or not os.access(pushpull, os.X_OK)):
        print(f"error: the pushpull launcher {a.pushpull!r} was not found or is not executable "
              "(give its path with --pushpull)", file=sys.stderr)
        return 2
    pushpull = os.path.abspath(pushpull) if pushpull else a.pushpull
    logs = a.logs or tempfile.mkdtemp(prefix="torch_vs_ddp-")
    os.makedirs(logs, exist_ok=True)
    runs = plan(a, pushpull)
    print(f"torch_vs_ddp: {len(runs)} runs, W = {a.workers}, logs in {logs}", file=sys.stderr)
    results = []  # (label, kind, cmd, records, error, seconds)
    for i, (label, kind, cmd) in enumerate(runs, 1):
        log_path = os.path.join(logs, f"{i:02d}-{re.sub(r'[^A-Za-z0-9]+', '_', label).strip('_')}.log")
        print(f"[{i}/{len(runs)}] {label}: {shlex.join(cmd)}", file=sys.stderr, flush=True)
        records, error, seconds, text = run_one(label, cmd, a.timeout, log_path, a.workers)
        if error:
            tail = "\n".join("    " + l for l in text.splitlines()[-25:])
            print(f"[{i}/{len(runs)}] {label} FAILED: {error} ({seconds:.0f} s); log {log_path}, "
                  f"last lines:\n{tail}", file=sys.stderr, flush=True)
        else:
            mean = statistics.mean(r["img_per_s"] for r in records)
            print(f"[{i}/{len(runs)}] {label}: {mean:.1f} img/s per rank ({seconds:.0f} s)",
                  file=sys.stderr, flush=True)
        results.append((label, kind, cmd, records, error, seconds))

    def mean_of(kind):
        for label, k, _, records, error, _ in results:
            if k == kind and not error:
                return statistics.mean(r["img_per_s"] for r in records)
        return None

    ceiling, ddp = mean_of("ceiling"), mean_of("ddp")
    first = next((r[3][0] for r in results if r[3]), {})
    print()
    print(f"## pushpull vs torch DDP: {a.model}, batch {a.batch} per rank, {a.image}x{a.image}, "
          f"W = {a.workers} ranks")
    print()
    print(f"device {first.get('device_name', '?')} ({a.device}), torch {first.get('torch', '?')}, "
          f"TF32 {a.tf32}, {a.warmup} warm-up + {a.steps} timed steps, SGD lr 0.01 momentum 0.9 "
          f"(0 with a compressor's own momentum)")
    print()
    print("| run | img/s per rank (mean) | slowest–fastest rank | img/s all ranks | "
          "vs DDP | vs ceiling | pushed per rank per step | compressed on; codecs (tensors) | run s |")
    print("|---|---:|---:|---:|---:|---:|---:|---|---:|")
    for label, kind, cmd, records, error, seconds in results:
        if error:
            print(f"| {label} | FAILED: {error} | | | | | | | {seconds:.0f} |")
            continue
        rates = [r["img_per_s"] for r in records]
        mean = statistics.mean(rates)
        vs_ddp = ratio(mean, ddp) if kind != "ddp" and kind != "ceiling" else ""
        vs_ceiling = ratio(mean, ceiling) if kind != "ceiling" else ""
        if kind == "ddp":
            backend = records[0].get("backend", "?")
            label = f"{label} ({backend})"
        pushed = where = ""
        if kind == "pushpull":
            pushed = human_bytes(statistics.mean(r["bytes_pushed_per_step"] for r in records))
            raw = statistics.mean(r["raw_bytes_per_step"] for r in records)
            if raw:
                pushed += f" of {human_bytes(raw)}"
            where = ", ".join(f"{d}: {n}" for d, n in sorted(records[0]["compressed_on"].items()))
            codecs = records[0].get("codecs") or {}
            where += "; " + ", ".join(f"{n} × {c}" for c, n in sorted(codecs.items()))
            calls = statistics.mean(r.get("driver_calls_per_step", 0) for r in records)
            where += f"; {calls:.0f} driver calls/step"
        print(f"| {label} | {fmt(mean)} | {fmt(min(rates))}–{fmt(max(rates))} | "
              f"{fmt(sum(rates))} | {vs_ddp} | {vs_ceiling} | {pushed} | {where} | {seconds:.0f} |")
    print()
    print("vs DDP, vs ceiling: mean img/s per rank of the run over that of torch DDP / the ceiling. "
          "compressed on: gradient tensors per device of pushpull's metrics; codecs: tensors per "
          "codec (tensors under cluster.min_compress_bytes travel as float32: none).")
    print()
    print("Command: `" + shlex.join([sys.executable, os.path.abspath(__file__)] + argv) + "`")
    print()
    for label, _, cmd, *_ in results:
        print(f"* {label}: `{shlex.join(cmd)}`")
    failed = [(label, error) for label, _, _, _, error, _ in results if error]
    if failed:
        print(file=sys.stderr)
        for label, error in failed:
            print(f"error: run {label!r} failed: {error} (log in {logs})", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
