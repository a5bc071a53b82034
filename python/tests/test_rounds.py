"""push_pull, broadcast and their forms on 2 workers and 2 servers, against independent
references: a float32 rank-order sum in numpy, and the Rust single-process reference."""

from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import assert_onebit_matches_the_reference, rank_order_sum, run_job, same_bits

SMALL = Path(__file__).resolve().parent / "small.toml"


@pytest.mark.parametrize("route", ["host", "emulated"])
def test_push_pull_and_broadcast_are_bit_exact(pushpull, seed, tmp_path, monkeypatch, route):
    """On the host path, and on the device path (the emulated device: what a CUDA tensor goes
    through, minus the GPU): the same bits."""
    monkeypatch.setenv("PUSHPULL_TORCH_ROUTE", route)
    p = run_job(pushpull, "rounds.py", tmp_path, seed, config=SMALL)
    assert p.returncode == 0, p.stderr
    assert "[rank 0] done" in p.stdout and "[rank 1] done" in p.stdout
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(2)]
    n = ranks[0]["size"]
    assert n == 2

    for i, _ in enumerate(ranks[0]["inputs"]):
        xs = [s["inputs"][i].numpy() for s in ranks]
        want = rank_order_sum(xs)
        if i % 2 == 1:
            want = want / np.float32(n)
        for s in ranks:
            assert same_bits(s["outputs"][i].numpy(), want), f"tensor t{i}, rank {s['rank']}"

    for step in range(2):
        for i, _ in enumerate(ranks[0]["group_in"][step]):
            want = rank_order_sum(
                [s["group_in"][step][i].numpy().astype(np.float32) for s in ranks]
            )
            for s in ranks:
                got = s["group_out"][step][i].numpy().astype(np.float32)
                assert same_bits(got, want), f"group tensor grp{i} round {step}, rank {s['rank']}"

    x = [s["copy_in"].numpy() for s in ranks]
    for s in ranks:
        assert same_bits(s["copy_out"][0], rank_order_sum(x))
        assert same_bits(s["copy_out"][1], rank_order_sum([v * 2 for v in x]) / np.float32(n))

    f64 = rank_order_sum([s["f64_in"].numpy().astype(np.float32) for s in ranks])
    view = rank_order_sum([s["view_in"].numpy().T for s in ranks])
    for s in ranks:
        assert s["f64_out"].dtype == torch.float64
        assert same_bits(s["f64_out"].numpy().astype(np.float32), f64)
        assert same_bits(s["view_out"].numpy().T, view)

    assert_onebit_matches_the_reference(ranks, SMALL)
    m = ranks[0]["metrics"]["tensors"]["onebit"]
    assert m["bytes_pushed"] < m["raw_bytes"] / 10, m
    # Where each tensor was compressed: broadcasts always through the host.
    metrics = ranks[0]["metrics"]
    place = "emulated" if route == "emulated" else "cpu"
    for name in ["t0", "t6", "grp1", "copy", "f64", "view", "onebit"]:
        assert metrics["tensors"][name]["device"] == place, (name, metrics["tensors"][name])
    assert metrics["tensors"]["b"]["device"] == "cpu"
    if route == "emulated":
        assert metrics["driver_calls"] > 0 and metrics["device_bytes"] > 0, metrics

    for s in ranks:
        assert same_bits(s["bcast_out"], ranks[1]["bcast_in"])
        for k, v in ranks[0]["model_in"].items():
            assert torch.equal(s["model_out"][k], v), k
        assert s["object_out"] == ranks[1]["object_in"]
        for got, want in zip(s["opt_out"], ranks[0]["opt_in"]):
            assert torch.equal(got, want)
    assert not torch.equal(ranks[1]["opt_in"][0], ranks[0]["opt_in"][0])
    # Rank 0 waited about 0.5 s for rank 1's push with the GIL released: its other thread ran in
    # both halves of the wait (turns counted by time, so a busy machine does not fail this).
    assert ranks[0]["wait_s"] > 0.3, ranks[0]["wait_s"]
    assert min(ranks[0]["turns_in_halves"]) > 0, ranks[0]["turns_in_halves"]
