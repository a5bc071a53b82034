"""What the test jobs share: the compressed tensor the tests compare with the single-process
reference (rounds.py, gpu.py: conftest.assert_onebit_matches_the_reference), with an
overflowing, discarded round; and `expect`, a call that must raise naming given words
(errors.py, byteps_api.py)."""

import torch

import pushpull.torch as bps

ONEBIT = {"byteps_compressor_type": "onebit", "byteps_ef_type": "vanilla"}


# Mixed precision in the onebit rounds: rank 1's gradient of "onebit" in round OVERFLOW_ROUND
# holds inf at element 5 (its sum comes back NaN everywhere, its state unchanged), while
# "onebit_b", pushed with it in one group (one batch on a GPU), changes state; the round is
# discarded for both.
OVERFLOW_ROUND = 1
ONEBIT_ROUNDS = 4
ONEBIT_TENSORS = {"onebit": 20_000, "onebit_b": 3_000}


def onebit_rounds(saved: dict, gen: torch.Generator, device: torch.device) -> None:
    """Declares ONEBIT_TENSORS and push_pulls ONEBIT_ROUNDS fresh random gradients of each on
    ``device`` as a group, averaged, one round overflowing on rank 1 and then discarded,
    saving the inputs and outputs (on the CPU) by round and tensor into ``saved``."""
    for name, n in ONEBIT_TENSORS.items():
        bps.declare(name, n, ONEBIT)
    saved["onebit_in"], saved["onebit_out"] = [], []
    for step in range(ONEBIT_ROUNDS):
        gs = [torch.randn(n, generator=gen) for n in ONEBIT_TENSORS.values()]
        if step == OVERFLOW_ROUND and bps.rank() == 1:
            gs[0][5] = float("inf")
        saved["onebit_in"].append([g.clone() for g in gs])
        got = bps.push_pull_group_inplace([g.to(device) for g in gs], average=True,
                                          names=list(ONEBIT_TENSORS))
        saved["onebit_out"].append([g.cpu() for g in got])
        if step == OVERFLOW_ROUND:
            bps.discard_last_round(list(ONEBIT_TENSORS))


def expect(case, exc_type, *words):
    """A decorator running ``f`` at once: it must raise ``exc_type`` whose message holds every
    one of ``words``; prints ``ok CASE: message``."""
    def run(f):
        try:
            f()
        except exc_type as e:
            missing = [w for w in words if w not in str(e)]
            assert not missing, f"{case}: {missing} not in {e!r}"
            print(f"ok {case}: {e}")
            return
        raise AssertionError(f"{case}: no {exc_type.__name__} raised")
    return run
