"""pushpull.torch in local groups: 4 workers as 2 hosts of 2 (`pushpull local --local-size 2`,
the script unchanged), against a float32 sum in the two-level order in numpy and the Rust
single-process reference."""

from pathlib import Path

import numpy as np
import torch

from conftest import assert_onebit_matches_the_reference, run_job, same_bits

SMALL = Path(__file__).resolve().parent / "small.toml"


def test_two_hosts_of_two_sum_each_host_then_the_hosts(pushpull, seed, tmp_path, monkeypatch):
    monkeypatch.setenv("PUSHPULL_TORCH_ROUTE", "host")
    p = run_job(pushpull, "rounds.py", tmp_path, seed, workers=4, local_size=2, config=SMALL)
    assert p.returncode == 0, p.stderr
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(4)]
    assert ranks[0]["size"] == 4

    for i, _ in enumerate(ranks[0]["inputs"]):
        x = [s["inputs"][i].numpy().astype(np.float32) for s in ranks]
        want = (x[0] + x[1]) + (x[2] + x[3])
        if i % 2 == 1:
            want = want / np.float32(4)
        for s in ranks:
            assert same_bits(s["outputs"][i].numpy(), want), f"tensor t{i}, rank {s['rank']}"
    # Not the flat job's order (((x0 + x1) + x2) + x3) somewhere: the groups are real.
    flat = []
    for i, _ in enumerate(ranks[0]["inputs"]):
        x = [s["inputs"][i].numpy().astype(np.float32) for s in ranks]
        want = ((x[0] + x[1]) + x[2]) + x[3]
        if i % 2 == 1:
            want = want / np.float32(4)
        flat.append(same_bits(ranks[0]["outputs"][i].numpy(), want))
    assert not all(flat), flat

    # The compressed tensors: the reference of the same cluster file, in groups of 2.
    groups = tmp_path / "groups.toml"
    groups.write_text(SMALL.read_text().replace("num_workers = 2", "num_workers = 4\nlocal_size = 2"))
    assert_onebit_matches_the_reference(ranks, groups)
    for s in ranks:
        assert same_bits(s["bcast_out"], ranks[1]["bcast_in"])
