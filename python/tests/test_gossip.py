"""pushpull.torch.DecentralizedOptimizer on a ring of 4 (the default graph): full-precision
D-PSGD against a plain numpy implementation of the same steps, bit for bit (each step:
x_i + Σ_j ⅓ (x_j − x_i) over the ring's neighbours in ascending rank order, summed in float64
from 0 and rounded to float32 once, then x − g); Moniqua at 2 bits stays within its
quantisation error of that; the mean model is the workers' mean."""

from pathlib import Path

import numpy as np
import torch

from conftest import run_job

SMALL = Path(__file__).resolve().parent / "small.toml"
N = 4


def load(out: Path, mode: str):
    return [torch.load(out / f"{mode}-{r}.pt", weights_only=False) for r in range(N)]


def plain_dpsgd(saved):
    """The job's steps in numpy, from rank 0's initial parameters on every rank."""
    names = list(saved[0]["initial"])
    xs = [{n: saved[0]["initial"][n].numpy().astype(np.float32) for n in names} for _ in range(N)]
    out = []
    for step in range(len(saved[0]["steps"])):
        avg = []
        for i in range(N):
            new = {}
            for n in names:
                acc = np.zeros(xs[i][n].shape, dtype=np.float64)
                for j in sorted({(i + 1) % N, (i + N - 1) % N}):
                    acc += (1.0 / 3.0) * (xs[j][n].astype(np.float64) - xs[i][n].astype(np.float64))
                new[n] = (xs[i][n].astype(np.float64) + acc).astype(np.float32)
            avg.append(new)
        xs = [{n: avg[i][n] - saved[i]["grads"][step][n].numpy() for n in names} for i in range(N)]
        out.append(xs)
    return out


def test_dpsgd_is_the_plain_algorithm_and_moniqua_stays_close(pushpull, seed, tmp_path):
    for mode in ["dpsgd", "moniqua", "moniqua-lr", "moniqua-bound"]:
        p = run_job(pushpull, "gossip.py", mode, tmp_path, seed, workers=N, config=SMALL)
        assert p.returncode == 0, f"{mode}: {p.stderr}"
    dpsgd, moniqua = load(tmp_path, "dpsgd"), load(tmp_path, "moniqua")
    want = plain_dpsgd(dpsgd)
    for step, xs in enumerate(want):
        for r in range(N):
            for n, x in xs[r].items():
                got = dpsgd[r]["steps"][step][n].numpy()
                assert np.array_equal(got.view(np.uint32), x.view(np.uint32)), (
                    f"seed {seed}: rank {r} step {step} {n}: max diff {np.abs(got - x).max()}"
                )
    # Moniqua (θ = 0.5, 2 bits: each decoded message within δ·B_θ = 0.5 of its sender's) from
    # the same start: within a few of those errors of D-PSGD after 4 steps, and not equal for
    # "w" ("b", under small.toml's min_compress_bytes, travels as float32: equal).
    last = len(want) - 1
    for r in range(N):
        for n in want[last][r]:
            d = np.abs(moniqua[r]["steps"][last][n].numpy() - want[last][r][n]).max()
            assert d < 2.0, f"seed {seed}: rank {r} {n}: {d}"
            assert (d > 0) == (n == "w"), f"seed {seed}: rank {r} {n}: {d}"
    # θ from the learning rate (0.5 × lr 1) is θ = 0.5: the same bits, so the rate reached the
    # codec on every worker (a round without one is refused).
    moniqua_lr = load(tmp_path, "moniqua-lr")
    for r in range(N):
        for step in range(len(want)):
            for n, x in moniqua[r]["steps"][step].items():
                got = moniqua_lr[r]["steps"][step][n].numpy()
                assert np.array_equal(got.view(np.uint32), x.numpy().view(np.uint32)), (
                    f"seed {seed}: theta_schedule = lr: rank {r} step {step} {n}"
                )
    # θ from the Theorem 2 bound: each rank's own G (its largest |grad| so far; the ring of 4
    # with ⅓ weights has ρ = ⅓), so each rank's messages have their own θ and every receiver
    # decodes them with it: within the rank's δ·B_θ = θ of D-PSGD's exchange, each step.
    bound = load(tmp_path, "moniqua-bound")
    for r in range(N):
        d = max(np.abs(bound[r]["steps"][last][n].numpy() - want[last][r][n]).max()
                for n in want[last][r])
        g = max(float(s[n].abs().max()) for s in bound[r]["grads"] for n in s)
        theta = 2 * 1.0 * g * np.log(16 * N) / (1 - 1 / 3)
        assert 0 < d < 4 * (len(want)) * theta, f"seed {seed}: rank {r}: {d} (theta {theta})"
    # The mean model: the workers' mean, the same on every rank.
    for n in want[last][0]:
        mean = np.mean([want[last][r][n].astype(np.float64) for r in range(N)], axis=0)
        for r in range(N):
            assert np.allclose(dpsgd[r]["mean"][n].numpy(), mean, atol=1e-6), f"rank {r} {n}"
