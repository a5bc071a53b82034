"""What :class:`DistributedOptimizer` averages: the gradients (the wrapped optimizer then steps
on their average, as under DDP), the updates (each worker steps its own copy of the
optimizer on its own gradient, and the parameter changes are averaged), or Adam's momentum
(DeepSpeed's 1-bit Adam: after a warm-up on uncompressed gradients, the second moment is
frozen and each worker's first moment is averaged); the rule that picks one for
``average="auto"``; and the momentum mode's step.

Why the rule exists (``bench/onebit_optimizers.py``, BENCHMARKS.md "Onebit with the user's
optimizer (simulated)"): onebit with error feedback hands the optimizer a scaled sign whose
error is paid back over later steps. An optimizer with momentum integrates that error again
(SGD with momentum 0.9 at 9.7 % on digits, 98.7 % uncompressed) and Adam's per-coordinate
statistics see the signs instead of the gradient (86.0 %, 98.2 % uncompressed). Averaging the
updates keeps the optimizer's state on each worker's true gradient, and the compressor sees
what is applied: 98.4 % with Adam. With Adam on a transformer whose second moment follows
the gradients' noise (betas 0.9, 0.95), each worker's own second moment costs as much as the
compression; freezing the warm-up's averaged one and averaging the first moment reaches
uncompressed quality (BENCHMARKS.md "Onebit with the user's AdamW, through the cluster").
"""

from __future__ import annotations

import sys
from typing import List, Mapping, Optional, Sequence

import torch

AVERAGES = ("auto", "gradients", "updates", "momentum")

# Compressors known to fail, with error feedback, when the gradients they return feed an
# optimizer with state of its own (momentum, per-coordinate statistics): the module
# docstring's measurements, and top-k 1 % under AdamW on bench/tta's transformer (4.350
# validation bits per byte against 3.104, BENCHMARKS.md "Onebit with the user's AdamW, through
# the cluster").
_FAIL_WITH_STATE = ("onebit", "topk")


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


def momentum_refusal(optimizer: torch.optim.Optimizer) -> Optional[str]:
    """Why ``average="momentum"`` cannot run ``optimizer``, or None: it takes
    ``torch.optim.Adam`` and ``AdamW`` (and their subclasses) without ``amsgrad``,
    ``maximize``, ``capturable`` or ``differentiable``, with a float learning rate."""
    name = type(optimizer).__name__
    if not isinstance(optimizer, (torch.optim.Adam, torch.optim.AdamW)):
        return f"{name} is not torch.optim.Adam or AdamW"
    for group in optimizer.param_groups:
        for key in ("amsgrad", "maximize", "capturable", "differentiable"):
            if group.get(key):
                return f"{name} has {key}=True"
        if isinstance(group.get("lr"), torch.Tensor):
            return f"{name} has a tensor learning rate"
    return None


def resolve(average: str, optimizer: torch.optim.Optimizer, names: Sequence[str],
            effective: Sequence[Optional[Mapping[str, str]]]) -> str:
    """``"gradients"``, ``"updates"`` or ``"momentum"`` for the optimizer ``optimizer``
    whose tensors ``names`` run the compressors ``effective`` (canonical maps, None where a
    map is refused: its declare says why). Where a compressor of ``_FAIL_WITH_STATE`` with
    error feedback would feed an optimizer with state, ``"auto"`` averages Adam's momentum
    (where :func:`momentum_refusal` allows) or else the updates, and says so once on stderr;
    ``"gradients"`` is refused there (``ValueError`` naming the optimizer, the tensor and what
    to use). Raises ``ValueError`` for an unknown ``average``, for ``"momentum"`` with an
    optimizer it cannot run (naming why), and for ``ef = corrected`` with the updates or the
    momentum averaged (the learning rate is applied after the exchange, or already in it)."""
    if average not in AVERAGES:
        raise ValueError(f"average = {average!r}: must be one of {', '.join(AVERAGES)}")
    failing = [(n, m["compressor"]) for n, m in zip(names, effective) if _fails_with_state(m)]
    state = optimizer_state(optimizer) if failing else None
    if average == "auto":
        average = "gradients"
        if state:
            average = "updates" if momentum_refusal(optimizer) else "momentum"
            what = {"updates": "the updates", "momentum": "the momentum"}[average]
            name, codec = failing[0]
            print(f"pushpull: DistributedOptimizer averages {what} of {state}, not its "
                  f"gradients: {codec} on {name!r} ({len(failing)} tensors) does not train "
                  f"when its gradients feed an optimizer with state (average={average!r}; see "
                  "DistributedOptimizer)", file=sys.stderr)
    elif average == "gradients" and state:
        name, codec = failing[0]
        raise ValueError(
            f"tensor {name!r}: {codec} with error feedback on the gradients of {state} does not "
            "train (the optimizer's state integrates the compression error); use "
            "average='auto' (or 'updates'), or plain SGD with the map's momentum = nesterov")
    if average == "momentum":
        why = momentum_refusal(optimizer)
        if why:
            raise ValueError(f"average='momentum' runs Adam and AdamW only: {why}; use "
                             "average='updates'")
    if average in ("updates", "momentum"):
        for n, m in zip(names, effective):
            if m is not None and m.get("ef") == "corrected":
                raise ValueError(
                    f"tensor {n!r}: ef = 'corrected' with average={average!r}: the learning "
                    "rate is not in what is averaged the way it expects; use ef = 'vanilla'")
    return average


def delta_of(params: List[torch.Tensor], before: List[torch.Tensor]) -> None:
    """Each parameter's update (its value now minus ``before``) into its ``.grad``, and the
    parameter back to ``before``."""
    for p, b in zip(params, before):
        if p.grad is None:
            p.grad = torch.empty_like(p)
        torch.sub(p, b, out=p.grad)
        p.copy_(b)


def _decoupled(optimizer: torch.optim.Optimizer, group: Mapping) -> bool:
    """Whether ``group``'s weight decay is AdamW's (applied to the parameter), not Adam's (added
    to the gradient): ``AdamW``, or ``Adam(decoupled_weight_decay=True)``."""
    return isinstance(optimizer, torch.optim.AdamW) or bool(group.get("decoupled_weight_decay"))


def local_momentum(optimizer: torch.optim.Optimizer, params: List[torch.Tensor]) -> None:
    """``average="momentum"`` after the warm-up, before the exchange: each parameter's
    ``.grad`` becomes this worker's first moment, ``beta1 * m + (1 - beta1) * g`` from the
    averaged momentum ``m`` in the optimizer's state and this worker's gradient ``g`` (plus
    ``weight_decay * p`` for Adam, whose decay is in the gradient). A parameter without a
    gradient contributes ``beta1 * m``."""
    group_of = {id(p): g for g in optimizer.param_groups for p in g["params"]}
    for p in params:
        group = group_of[id(p)]
        beta1 = group["betas"][0]
        m = optimizer.state[p]["exp_avg"]
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        g = p.grad
        if not _decoupled(optimizer, group) and group["weight_decay"] != 0:
            g.add_(p, alpha=group["weight_decay"])
        g.mul_(1 - beta1).add_(m, alpha=beta1)


def frozen_step(optimizer: torch.optim.Optimizer, params: List[torch.Tensor],
                v_hat: List[torch.Tensor]) -> None:
    """``average="momentum"`` after the exchange: each parameter's ``.grad`` holds the averaged
    first moment ``m``, which becomes the state's ``exp_avg``; the step count goes up by one;
    the parameter takes Adam's step ``lr * (m / (1 - beta1^t)) / (sqrt(v_hat) + eps)`` with
    the frozen bias-corrected second moment ``v_hat`` (after AdamW's decay ``p *= 1 - lr *
    weight_decay``). ``exp_avg_sq`` is kept at ``v_hat * (1 - beta2^t)``, so the state reads as
    Adam's own (a checkpoint of it restarts frozen at the same ``v_hat``)."""
    group_of = {id(p): g for g in optimizer.param_groups for p in g["params"]}
    for p, v in zip(params, v_hat):
        group = group_of[id(p)]
        beta1, beta2 = group["betas"]
        lr, eps = group["lr"], group["eps"]
        state = optimizer.state[p]
        state["exp_avg"].copy_(p.grad)
        state["step"] += 1
        t = float(state["step"])
        torch.mul(v, 1 - beta2 ** t, out=state["exp_avg_sq"])
        if _decoupled(optimizer, group) and group["weight_decay"] != 0:
            p.mul_(1 - lr * group["weight_decay"])
        p.addcdiv_(p.grad, v.sqrt().add_(eps), value=-lr / (1 - beta1 ** t))


def freeze(optimizer: torch.optim.Optimizer, params: List[torch.Tensor]) -> List[torch.Tensor]:
    """The bias-corrected second moments ``exp_avg_sq / (1 - beta2^t)`` of ``params`` as the
    optimizer's state holds them (after its warm-up steps, or as a checkpoint restored them)."""
    group_of = {id(p): g for g in optimizer.param_groups for p in g["params"]}
    out = []
    for p in params:
        beta2 = group_of[id(p)]["betas"][1]
        state = optimizer.state[p]
        out.append(state["exp_avg_sq"] / (1 - beta2 ** float(state["step"])))
    return out
