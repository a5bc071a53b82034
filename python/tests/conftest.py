"""Shared fixtures: the `pushpull` binary and ways to run a job of Python workers.

Each test prints the seed it drew (rerun with PUSHPULL_TEST_SEED=N to repeat one).
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
JOBS = Path(__file__).resolve().parent / "jobs"


def pushpull_bin() -> Path:
    """`PUSHPULL_BIN`, else the workspace's debug build (built here if missing)."""
    env = os.environ.get("PUSHPULL_BIN")
    if env:
        return Path(env)
    target = Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target"))
    exe = target / "debug" / "pushpull"
    if not exe.exists():
        subprocess.run(["cargo", "build", "--bins"], cwd=REPO, check=True)
    return exe


@pytest.fixture(scope="session")
def pushpull() -> Path:
    return pushpull_bin()


@pytest.fixture
def seed() -> int:
    s = int(os.environ.get("PUSHPULL_TEST_SEED", random.randrange(2**32)))
    print(f"seed {s} (rerun with PUSHPULL_TEST_SEED={s})")
    return s


def run_job(pushpull: Path, script: str, *args, workers: int = 2, servers: int = 2,
            config: Path | None = None, local_size: int | None = None,
            timeout: float = 180) -> subprocess.CompletedProcess:
    """`pushpull local --workers N --servers S [--config F] [--local-size G] -- python
    jobs/SCRIPT ARGS`."""
    cmd = [str(pushpull), "local", "--workers", str(workers), "--servers", str(servers)]
    if config is not None:
        cmd += ["--config", str(config)]
    if local_size is not None:
        cmd += ["--local-size", str(local_size)]
    cmd += ["--", sys.executable, str(JOBS / script), *map(str, args)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    print(p.stdout)
    print(p.stderr, file=sys.stderr)
    return p


def check_fusion_job(tmp_path, workers: int = 2) -> None:
    """What jobs/fusion.py saved: the fused and the unfused optimizer give every gradient the
    bits of the float32 rank-order average, and the fused one declared one tensor for the
    biases."""
    import numpy as np
    import torch

    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(workers)]
    for name in ranks[0]["grads"]:
        want = rank_order_sum([s["grads"][name].numpy() for s in ranks]) / np.float32(workers)
        for r, s in enumerate(ranks):
            for tag in ("fused", "apart"):
                assert same_bits(s["results"][tag][name].numpy(), want), f"{tag} {name}, rank {r}"
    tensors = [t for t in ranks[0]["tensors"] if t.startswith("Gradient.fused[")]
    assert tensors == ["Gradient.fused[fused.0.bias..fused.2.bias]"], ranks[0]["tensors"]
    assert "Gradient.apart.0.bias" in ranks[0]["tensors"], ranks[0]["tensors"]


def rank_order_sum(xs):
    """The servers' sum: float32, rank 0 first, then rank 1, ..."""
    import numpy as np

    acc = np.array(xs[0], dtype=np.float32)
    for x in xs[1:]:
        acc = acc + np.asarray(x, dtype=np.float32)
    return acc


def same_bits(a, b) -> bool:
    """Whether two arrays hold the same float32 bits (and shape)."""
    import numpy as np

    a = np.ascontiguousarray(np.asarray(a, dtype=np.float32))
    b = np.ascontiguousarray(np.asarray(b, dtype=np.float32))
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


def assert_onebit_matches_the_reference(ranks, config: Path) -> None:
    """The jobs' compressed tensors (jobs/job_common.py: onebit with error feedback, averaged,
    each rank's saved inputs and outputs by round, one round overflowing on rank 1 and
    discarded) against the Rust single-process reference with the job's seed and cluster
    file."""
    import numpy as np

    from pushpull import Reference

    sys.path.insert(0, str(JOBS))
    from job_common import ONEBIT, ONEBIT_ROUNDS, ONEBIT_TENSORS, OVERFLOW_ROUND

    ref = Reference(len(ranks), ranks[0]["job_seed"], str(config))
    for name, n in ONEBIT_TENSORS.items():
        ref.declare(name, n, ONEBIT)
    for step in range(ONEBIT_ROUNDS):
        for i, name in enumerate(ONEBIT_TENSORS):
            got = ref.push_pull(name, [s["onebit_in"][step][i].numpy().tobytes() for s in ranks], True)
            for s in ranks:
                want = np.frombuffer(got[s["rank"]], dtype=np.float32)
                out = s["onebit_out"][step][i].numpy()
                assert same_bits(out, want), f"{name} round {step}, rank {s['rank']}"
                # The overflowing chunk of "onebit" is NaN, "onebit_b" finite.
                if step == OVERFLOW_ROUND:
                    assert np.isnan(out[5]) if i == 0 else np.isfinite(out).all(), (name, step)
        if step == OVERFLOW_ROUND:
            for name in ONEBIT_TENSORS:
                ref.discard_last_round(name)
