"""Step time of a workload in one process with no communication (the model, batch, optimizer
and clipping of ``train.py``, one thread), and what exchanging its gradients would add at a
given link rate, to size a workload (at 100 Mbit/s DDP's step should be 6-10x this
step).

    python bench/tta/steptime.py --workload transformer --size default --steps 20
    python bench/tta/steptime.py --workload conv --set d_model=192 --set n_layer=6

Prints one JSON object: the workload's description (``params``, ``grad_bytes``, size fields),
``step_s`` (the median of the timed steps, after ``--warmup`` untimed ones), ``step_s_min``
(the fastest, a steadier figure on a busy machine), ``first_loss``
and ``last_loss``, and per ``--rates`` entry (Mbit/s) ``comm_s``, the seconds to send
``grad_bytes`` once at that rate (a ring all-reduce on 2 workers sends each rank's gradient
bytes once and receives as much), and ``ratio`` = (``step_s`` + ``comm_s``) / ``step_s``, the
slow-down if nothing overlapped.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

import corpus  # noqa: E402
import models  # noqa: E402


def main(argv=None) -> None:
    """Measures and prints (see the module's description)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workload", choices=models.WORKLOADS, required=True)
    p.add_argument("--size", default="default")
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE")
    p.add_argument("--steps", type=int, default=10, help="timed steps")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    p.add_argument("--rates", default="100", help="link rates in Mbit/s, comma-separated")
    a = p.parse_args(argv)
    try:
        s = models.size_of(a.workload, a.size, models.parse_overrides(a.set))
    except ValueError as e:
        p.error(str(e))
    torch.set_num_threads(1)
    model = models.make_model(a.workload, s, 0)
    opt = models.make_optimizer(a.workload, model, s)
    total = a.warmup + a.steps
    times, losses = [], []
    for step in range(total):
        x, y = corpus.train_batch(0, step, 0, s.batch, s.seq_len)
        t0 = time.perf_counter()
        for group in opt.param_groups:
            group["lr"] = models.lr_at(a.workload, s, step, total)
        opt.zero_grad()
        loss = models.loss_of(model, x, y)
        loss.backward()
        if s.clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), s.clip)
        opt.step()
        losses.append(loss.item())
        if step >= a.warmup:
            times.append(time.perf_counter() - t0)
    d = models.describe(a.workload, s, model)
    step_s = statistics.median(times)
    d.update(step_s=step_s, step_s_min=min(times), first_loss=losses[0], last_loss=losses[-1], rates={})
    for rate in (float(r) for r in a.rates.split(",") if r.strip()):
        comm = d["grad_bytes"] * 8 / (rate * 1e6)
        d["rates"][f"{rate:g}"] = {"comm_s": comm, "ratio": (step_s + comm) / step_s}
    print(json.dumps(d))


if __name__ == "__main__":
    main()
