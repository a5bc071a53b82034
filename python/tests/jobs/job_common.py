"""What the test jobs (rounds.py, gpu.py) share: the compressed tensor the tests compare with the
single-process reference (conftest.assert_onebit_matches_the_reference)."""

import torch

import pushpull.torch as bps

ONEBIT = {"byteps_compressor_type": "onebit", "byteps_ef_type": "vanilla"}


def onebit_rounds(saved: dict, gen: torch.Generator, device: torch.device) -> None:
    """Declares "onebit" (20,000 elements) and push_pulls three fresh random gradients on
    ``device``, averaged, saving the inputs and outputs (on the CPU) into ``saved``."""
    bps.declare("onebit", 20_000, ONEBIT)
    saved["onebit_in"], saved["onebit_out"] = [], []
    for _ in range(3):
        g = torch.randn(20_000, generator=gen)
        saved["onebit_in"].append(g.clone())
        saved["onebit_out"].append(bps.push_pull(g.to(device), average=True, name="onebit").cpu())
