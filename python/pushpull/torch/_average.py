"""What :class:`DistributedOptimizer` averages: the gradients (the wrapped optimizer then steps
on their average, as under DDP) or the updates (each worker steps its own copy of the
optimizer on its own gradient, and the parameter changes are averaged), and the rule that
picks one for ``average="auto"``.

Why the rule exists (``bench/onebit_optimizers.py``, BENCHMARKS.md "Onebit with the user's
optimizer (simulated)"): onebit with error feedback hands the optimizer a scaled sign whose
error is paid back over later steps. An optimizer with momentum integrates that error again
(SGD with momentum 0.9 at 9.7 % on digits, 98.7 % uncompressed) and Adam's per-coordinate
statistics see the signs instead of the gradient (86.0 %, 98.2 % uncompressed). Averaging the
updates keeps the optimizer's state on each worker's true gradient, and the compressor sees
what is applied: 98.4 % with Adam.
"""

from __future__ import annotations

import sys
from typing import List, Mapping, Optional, Sequence

import torch

AVERAGES = ("auto", "gradients", "updates")

# Compressors known to fail, with error feedback, when the gradients they return feed an
# optimizer with state of its own (momentum, per-coordinate statistics): the module
# docstring's measurements.
_FAIL_WITH_STATE = ("onebit",)


def _fails_with_state(m: Optional[Mapping[str, str]]) -> bool:
    return (m is not None and m.get("compressor") in _FAIL_WITH_STATE
            and m.get("ef", "none") != "none")


def optimizer_state(optimizer: torch.optim.Optimizer) -> Optional[str]:
    """What gives ``optimizer`` a state that integrates the gradients it is handed (momentum,
    running moments), as words for an error message; None for plain SGD (no momentum), the
    only optimizer whose step is a fixed multiple of the gradient."""
    name = type(optimizer).__name__
    if isinstance(optimizer, torch.optim.SGD):
        for group in optimizer.param_groups:
            m = group.get("momentum", 0)
            if isinstance(m, (int, float)) and m > 0:
                return f"{name} with momentum={m}"
        return None
    for group in optimizer.param_groups:
        if "betas" in group:
            return f"{name} (betas={tuple(group['betas'])})"
    return name


def resolve(average: str, optimizer: torch.optim.Optimizer, names: Sequence[str],
            effective: Sequence[Optional[Mapping[str, str]]]) -> str:
    """``"gradients"`` or ``"updates"`` for the optimizer ``optimizer`` whose tensors
    ``names`` run the compressors ``effective`` (canonical maps, None where a map is refused:
    its declare says why). ``"auto"`` averages the updates where a compressor of
    ``_FAIL_WITH_STATE`` with error feedback would feed an optimizer with state, and says so
    once on stderr;
    ``"gradients"`` is refused there (``ValueError`` naming the optimizer, the tensor and what
    to use). Raises ``ValueError`` for an unknown ``average``, and for ``ef = corrected`` with
    the updates averaged (the updates already carry the learning rate)."""
    if average not in AVERAGES:
        raise ValueError(f"average = {average!r}: must be one of {', '.join(AVERAGES)}")
    failing = [(n, m["compressor"]) for n, m in zip(names, effective) if _fails_with_state(m)]
    state = optimizer_state(optimizer) if failing else None
    if average == "auto":
        average = "updates" if state else "gradients"
        if state:
            name, codec = failing[0]
            print(f"pushpull: DistributedOptimizer averages the updates of {state}, not its "
                  f"gradients: {codec} on {name!r} ({len(failing)} tensors) does not train "
                  "when its gradients feed an optimizer with state (average='updates'; see "
                  "DistributedOptimizer)", file=sys.stderr)
    elif average == "gradients" and state:
        name, codec = failing[0]
        raise ValueError(
            f"tensor {name!r}: {codec} with error feedback on the gradients of {state} does not "
            "train (the optimizer's state integrates the compression error); use "
            "average='updates' (or 'auto'), or plain SGD with the map's momentum = nesterov")
    if average == "updates":
        for n, m in zip(names, effective):
            if m is not None and m.get("ef") == "corrected":
                raise ValueError(
                    f"tensor {n!r}: ef = 'corrected' with average='updates': the updates "
                    "already carry the learning rate; use ef = 'vanilla'")
    return average


def delta_of(params: List[torch.Tensor], before: List[torch.Tensor]) -> None:
    """Each parameter's update (its value now minus ``before``) into its ``.grad``, and the
    parameter back to ``before``."""
    for p, b in zip(params, before):
        if p.grad is None:
            p.grad = torch.empty_like(p)
        torch.sub(p, b, out=p.grad)
        p.copy_(b)
