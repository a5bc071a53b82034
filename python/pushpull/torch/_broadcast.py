"""Broadcasts from a root worker: :func:`broadcast` (and Horovod's :func:`broadcast_`,
:func:`broadcast_async_`, :func:`broadcast_async`),
:func:`broadcast_parameters`, :func:`broadcast_optimizer_state` and
:func:`broadcast_object`."""

from __future__ import annotations

import pickle
from typing import List, Mapping, Optional, Tuple

import torch

from ._declare import _ensure_declared
from ._push_pull import _new_name, _register, push_pull
from ._round import _CONVERTIBLE, _Round
from ._state import rank


def broadcast_(tensor: torch.Tensor, root_rank: int, name: Optional[str] = None) -> torch.Tensor:
    """Makes ``tensor`` equal to the ``root_rank`` worker's, bit for bit, in place, and returns
    it (Horovod's ``broadcast_``; a tensor's compressor is not used for broadcasts; CUDA
    tensors go through a host copy). Integer tensors are exact while the root's values are
    below 2**24 in magnitude (else every worker raises ``ValueError`` naming the tensor; see
    :func:`push_pull`)."""
    name = name if name is not None else _new_name("broadcast")
    r = _Round(name, tensor, host_only=True)
    _ensure_declared(name, r, 0)
    r.start_broadcast(root_rank)
    return r.finish()


class _BroadcastFunction(torch.autograd.Function):
    """:func:`broadcast` as an autograd function, as Horovod's: the gradient of the result is
    averaged over the workers and goes to the root's input (every other worker's input gets
    zeros)."""

    @staticmethod
    def forward(ctx, tensor, root_rank, name):
        ctx.root_rank, ctx.name = root_rank, name
        return broadcast_(tensor.detach().clone(), root_rank, name)

    @staticmethod
    def backward(ctx, grad):
        reduced = push_pull(grad.contiguous(), True, f"{ctx.name}.grad")
        if rank() != ctx.root_rank:
            reduced = torch.zeros_like(reduced)
        return reduced, None, None


def broadcast(tensor: torch.Tensor, root_rank: int, name: Optional[str] = None) -> torch.Tensor:
    """The ``root_rank`` worker's ``tensor``, bit for bit, as a new tensor; ``tensor`` is not
    changed (Horovod's ``broadcast``; :func:`broadcast_` writes in place). Gradients flow back
    as through Horovod's: averaged over the workers, to the root's input. Integer tensors as in
    :func:`broadcast_`."""
    name = name if name is not None else _new_name("broadcast")
    if tensor.requires_grad and torch.is_grad_enabled():
        return _BroadcastFunction.apply(tensor, root_rank, name)
    return broadcast_(tensor.detach().clone(), root_rank, name)


def broadcast_async_(tensor: torch.Tensor, root_rank: int, name: Optional[str] = None) -> int:
    """Horovod's in-place async broadcast: starts :func:`broadcast` and returns a handle whose
    :func:`synchronize` returns ``tensor``, then equal to the root's."""
    name = name if name is not None else _new_name("broadcast")
    r = _Round(name, tensor, host_only=True)
    _ensure_declared(name, r, 0)
    r.start_broadcast(root_rank)
    return _register(r)


def broadcast_async(tensor: torch.Tensor, root_rank: int, name: Optional[str] = None) -> int:
    """Horovod's async broadcast, out of place: :func:`broadcast_async_` of a copy of
    ``tensor`` (which is not modified); :func:`synchronize` returns the root's values."""
    return broadcast_async_(tensor.detach().clone(), root_rank, name)


def _named_tensors(params) -> List[Tuple[str, torch.Tensor]]:
    if isinstance(params, Mapping):
        return sorted(params.items())
    items = list(params)
    if items and not isinstance(items[0], tuple):
        return [(f"param.{i}", p) for i, p in enumerate(items)]
    return items


def broadcast_parameters(params, root_rank: int, prefix: str = "Parameter.") -> None:
    """Makes every worker's parameters (a ``state_dict()``, ``named_parameters()``, or a list of
    tensors) equal to the ``root_rank`` worker's, in place. Floating tensors are broadcast in
    float32 rounds declared ``PREFIX + NAME`` (BytePS's ``prefix``, default ``"Parameter."``),
    all in flight at once; other tensors (e.g. BatchNorm's ``num_batches_tracked``) go through
    :func:`broadcast_object`, declared under ``PREFIX + "non_float"``."""
    floats, others = [], {}
    for name, p in _named_tensors(params):
        if p is None:
            continue
        if p.dtype in _CONVERTIBLE:
            floats.append((f"{prefix}{name}", p))
        else:
            others[name] = p
    rounds = []
    for name, p in floats:
        r = _Round(name, p.data if isinstance(p, torch.nn.Parameter) else p, host_only=True)
        _ensure_declared(name, r, 0)
        r.start_broadcast(root_rank)
        rounds.append(r)
    for r in rounds:
        r.finish()
    if others:
        got = broadcast_object(others, root_rank, name=f"{prefix}non_float")
        with torch.no_grad():
            for name, p in others.items():
                p.copy_(got[name])


def broadcast_optimizer_state(
    optimizer: torch.optim.Optimizer, root_rank: int, prefix: str = "Parameter."
) -> None:
    """Makes every worker's optimizer state (momentum buffers, step counts, hyperparameters)
    equal to the ``root_rank`` worker's: its ``state_dict()`` is broadcast with
    :func:`broadcast_object` (declared under ``PREFIX + "optimizer_state"``, BytePS's
    ``prefix``) and loaded on the others. Unlike BytePS, a state not created yet is not
    created by a step with zero gradients: the root's state, empty or not, is what every
    worker gets."""
    state = broadcast_object(optimizer.state_dict(), root_rank, name=f"{prefix}optimizer_state")
    if rank() != root_rank:
        optimizer.load_state_dict(state)


def broadcast_object(obj, root_rank: int = 0, name: Optional[str] = None):
    """Returns the ``root_rank`` worker's ``obj`` on every worker: pickled, and sent in two
    float32 broadcasts (the length, then the bytes, three per element as an integer below
    2**24, which float32 holds exactly: broadcasts carry finite floats only)."""
    name = name if name is not None else "broadcast_object"
    me = rank()
    payload = pickle.dumps(obj) if me == root_rank else b""
    n = len(payload)
    header = torch.tensor([n & 0xFFFFFF, n >> 24], dtype=torch.float32)
    broadcast_(header, root_rank, name=f"{name}.length")
    n = int(header[0]) | (int(header[1]) << 24)
    elems = max((n + 2) // 3, 1)
    body = torch.zeros(elems, dtype=torch.float32)
    if me == root_rank:
        b = torch.zeros(elems * 3, dtype=torch.int32)
        b[:n] = torch.frombuffer(bytearray(payload), dtype=torch.uint8).to(torch.int32)
        b = b.view(elems, 3)
        body.copy_(b[:, 0] | (b[:, 1] << 8) | (b[:, 2] << 16))
    broadcast_(body, root_rank, name=f"{name}.bytes.{elems}")
    v = body.to(torch.int32)
    out = torch.stack([v & 0xFF, (v >> 8) & 0xFF, (v >> 16) & 0xFF], dim=1).reshape(-1)[:n]
    return pickle.loads(out.to(torch.uint8).numpy().tobytes())
