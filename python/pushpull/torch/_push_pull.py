"""push_pull's rounds: :func:`_start_sums` (rounds started together, one native call per
place), every form of :func:`push_pull` (in place or not, async, grouped, with autograd), the
handles of rounds in flight (:func:`poll`, :func:`synchronize`) and
:func:`discard_last_round`."""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import torch

from . import _state
from ._declare import _check_sync_args, _ensure_declared
from ._round import _Ordering, _Round, _worker_stream
from ._state import _check_running, _w
from .compression import Compression, _Compressor, _UserCompressor, check_compression


def _start_sums(rounds: Sequence[_Round], average: bool) -> None:
    """Starts the push_pull rounds of ``rounds`` together: one native call per place (the
    host, a GPU, the emulated device), a group call (one batch on a device) where there are
    several. Integer rounds are summed (their average is taken at synchronize)."""
    _check_running("push_pull")
    if any(r.device is not None and r.device.startswith("cuda") for r in rounds):
        # The worker's stream is about to wait for the current stream. If that stream waits
        # for rounds of an ordered step (DistributedOptimizer's ordered_step) whose decodes
        # are not queued yet, they would be queued behind this wait: a deadlock. Once their
        # outcomes are in, their decodes and the word releasing the stream are queued.
        _state.collect_deferred()
    by_place: Dict[Tuple[Optional[str], bool], List[_Round]] = {}
    for r in rounds:
        if r.integer:
            r.int_average = average
        by_place.setdefault((r.device, average and not r.integer), []).append(r)
    for (device, avg), rs in by_place.items():
        entries = [r.entry() for r in rs]
        if device is None:
            if len(rs) == 1:
                natives = [_w().push_pull(*entries[0], avg)]
            else:
                natives = _w().push_pull_group(entries, avg)
        else:
            ordering = None
            if device.startswith("cuda"):
                # The round's work follows what is queued on the tensors' current stream, and
                # torch's allocator keeps their memory until the worker's stream is done.
                stream = _worker_stream(device)
                stream.wait_stream(torch.cuda.current_stream(torch.device(device)))
                for r in rs:
                    r.work.record_stream(stream)
                ordering = _Ordering(stream)
            natives = _w().push_pull_group_device(entries, avg, device)
            for r in rs:
                r.ordering = ordering
        for r, native in zip(rs, natives):
            r.native = native
            _state.live.add(r)


def _register(r: _Round) -> int:
    h = next(_state.next_handle)
    _state.handles[h] = r
    return h


def _new_name(kind: str) -> str:
    return f"{kind}.noname.{next(_state.noname)}"


def push_pull_async_inplace(
    tensor: torch.Tensor,
    average: bool = True,
    name: Optional[str] = None,
    version: int = 0,
    priority: int = 0,
    staleness: int = 0,
    compression: _Compressor = Compression.none,
) -> int:
    """Starts summing ``tensor`` over every worker in place (the average with
    ``average=True``: the sum divided by ``size()``). Returns a handle for :func:`poll` and
    :func:`synchronize`; don't read or write the tensor until then.

    BytePS's signature. ``version`` and ``staleness`` must be 0 (pushpull's rounds are
    synchronous; anything else raises ``ValueError`` naming the argument). ``compression``
    (``Compression.none`` or ``Compression.fp16``) is the tensor's compressor: used when this
    call declares the tensor, and checked against the declared one otherwise (``ValueError``
    when they differ); or a user-defined compressor (``compress(tensor) -> (tensor, ctx)``,
    ``decompress(tensor, ctx)``, as Horovod's and BytePS's ``Compressor``): the round sums what
    ``compress`` gives, and ``decompress`` of the sum is written into ``tensor``. Integer
    tensors: see :func:`push_pull`."""
    _check_sync_args(version, staleness)
    compression = check_compression(compression)
    name = name if name is not None else _new_name("push_pull")
    if isinstance(compression, _UserCompressor):
        # Horovod's way: the round sums what compress gives; decompress makes the result,
        # written into the caller's tensor.
        sent, ctx = compression.compress(tensor)

        def then(result, tensor=tensor, ctx=ctx):
            with torch.no_grad():
                tensor.copy_(compression.decompress(result, ctx))
            return tensor

        r = _Round(name, sent)
        r.then = then
    else:
        r = _Round(name, tensor)
    _ensure_declared(name, r, priority, compression)
    _start_sums([r], average)
    return _register(r)


def push_pull_async(
    tensor: torch.Tensor,
    average: bool = True,
    name: Optional[str] = None,
    version: int = 0,
    priority: int = 0,
    compression: _Compressor = Compression.none,
) -> int:
    """Starts summing (or averaging) a copy of ``tensor`` over every worker; ``tensor`` is not
    modified. Returns a handle: :func:`synchronize` returns the result as a new tensor (same
    shape, dtype and device). Arguments as in :func:`push_pull_async_inplace`."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"push_pull_async: tensor = {tensor!r}: expected a torch.Tensor")
    return push_pull_async_inplace(
        tensor.detach().clone(), average, name, version, priority, 0, compression
    )


def push_pull_group_async_inplace(
    tensors: Sequence[torch.Tensor],
    average: bool = True,
    names: Optional[Sequence[Optional[str]]] = None,
    priorities: Optional[Sequence[int]] = None,
) -> List[int]:
    """:func:`push_pull_async_inplace` of every tensor of ``tensors``, started together as one
    group (Horovod's ``grouped_allreduce``): on every worker the chunks leave in the tensors'
    priority order, whatever order ``tensors`` lists them in and however the rounds' encoding
    interleaves. Hand over a step's gradients together this way (separate calls made at the
    same moment may leave in a different order on each worker, so some sums wait for the
    slowest). ``names`` and ``priorities`` (one per tensor, or ``None``) are as in
    :func:`push_pull_async_inplace`; tensors not declared yet are declared in the order
    listed, a collective, so list new tensors in the same order on every worker (or declare
    them first). Returns one handle per tensor, in order, for :func:`poll` and
    :func:`synchronize`."""
    tensors = list(tensors)
    names = list(names) if names is not None else [None] * len(tensors)
    priorities = list(priorities) if priorities is not None else [0] * len(tensors)
    if len(names) != len(tensors) or len(priorities) != len(tensors):
        raise ValueError(
            f"{len(tensors)} tensors, {len(names)} names and {len(priorities)} priorities: "
            "give one name and one priority per tensor (or None)"
        )
    rounds = []
    for tensor, name, priority in zip(tensors, names, priorities):
        name = name if name is not None else _new_name("push_pull")
        r = _Round(name, tensor)
        _ensure_declared(name, r, priority)
        rounds.append(r)
    _start_sums(rounds, average)
    return [_register(r) for r in rounds]


def push_pull_group_inplace(
    tensors: Sequence[torch.Tensor],
    average: bool = True,
    names: Optional[Sequence[Optional[str]]] = None,
    priorities: Optional[Sequence[int]] = None,
) -> List[torch.Tensor]:
    """:func:`push_pull_group_async_inplace` and :func:`synchronize` of every handle: returns
    the tensors, which now hold their sums (or averages)."""
    handles = push_pull_group_async_inplace(tensors, average, names, priorities)
    return [synchronize(h) for h in handles]


def discard_last_round(names: Sequence[str]) -> None:
    """Discards the last push_pull round of every tensor of ``names``: its compressor state
    (error feedback, momentum), on this worker and on the servers, returns to what it was before
    that round. For a step a loss scaler skipped; every worker must discard the same rounds
    (:class:`DistributedOptimizer` does it on its own when a step's result is not finite). A
    checkpoint may be saved right after (:func:`save_state` keeps the discard). Raises
    ``PushPullError`` naming the checkpoint for a tensor loaded from one (:func:`load_state`)
    with no round since, whose last round ran before it was saved and was not discarded then."""
    _w().discard_last_round(list(names))


def poll(handle: int) -> bool:
    """Whether the round of ``handle`` has finished (then :func:`synchronize` returns at once)."""
    r = _state.handles.get(handle)
    if r is None:
        raise ValueError(f"unknown or already synchronized handle {handle}")
    return r.native.poll()


def synchronize(handle: int) -> Optional[torch.Tensor]:
    """Waits for the round of ``handle`` (the GIL is released meanwhile) and returns its tensor,
    which now holds the result. Raises the round's error. A handle that is unknown, or was
    synchronized already, returns ``None``, as BytePS's and Horovod's do."""
    r = _state.handles.pop(handle, None)
    if r is None:
        return None
    return r.finish()


def push_pull_inplace(
    tensor: torch.Tensor,
    average: bool = True,
    name: Optional[str] = None,
    version: int = 0,
    priority: int = 0,
    staleness: int = 0,
    compression: _Compressor = Compression.none,
) -> torch.Tensor:
    """:func:`push_pull_async_inplace` and :func:`synchronize`: returns ``tensor``."""
    return synchronize(
        push_pull_async_inplace(tensor, average, name, version, priority, staleness, compression)
    )


class _PushPullFunction(torch.autograd.Function):
    """:func:`push_pull` as an autograd function: the gradient of the result is push_pulled
    back (the same name and reduction), as in BytePS."""

    @staticmethod
    def forward(ctx, tensor, average, name, priority, compression):
        ctx.average, ctx.name, ctx.compression = average, name, compression
        return synchronize(push_pull_async(tensor, average, name, 0, priority, compression))

    @staticmethod
    def backward(ctx, grad):
        out = push_pull(grad, ctx.average, ctx.name, compression=ctx.compression)
        return out, None, None, None, None


def push_pull(
    tensor: torch.Tensor,
    average: bool = True,
    name: Optional[str] = None,
    version: int = 0,
    priority: int = 0,
    compression: _Compressor = Compression.none,
) -> torch.Tensor:
    """The sum (or average) of ``tensor`` over every worker, as a new tensor; ``tensor`` is
    unchanged. Every worker's result is bit-identical: servers add the workers' data in rank
    order, in float32. If ``tensor`` requires grad, the result does too, and its gradient is
    push_pulled back under the same name (BytePS's autograd function). ``version``,
    ``priority`` and ``compression`` as in :func:`push_pull_async_inplace`; unlike BytePS,
    ``name`` may be left out (``push_pull.noname.N`` from a counter).

    Integer tensors (int8, uint8, int16, int32, int64; also in the in-place, async and
    broadcast forms) are summed exactly in float32, uncompressed, through a host copy that
    also carries each element's magnitude: the sum is exact while, for every element, the
    magnitudes summed over the workers stay below 2**24 (float32 holds every integer up to
    that, so every partial sum is exact). Otherwise every worker raises ``ValueError`` naming
    the tensor and the element, and the tensor is left unchanged. A round carries twice the
    elements (an integer tensor of n elements is declared with 2n). The exact sum is then
    converted to the dtype (wrapping as a sum in that dtype would), and ``average=True``
    floor-divides it by ``size()`` (rounding toward minus infinity: torch's ``floor_divide``,
    which BytePS's average of an integer tensor uses), e.g. (-3 + 0) averaged over 2 workers
    is -2."""
    _check_sync_args(version)
    check_compression(compression)
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"push_pull: tensor = {tensor!r}: expected a torch.Tensor")
    name = name if name is not None else _new_name("push_pull")
    if tensor.requires_grad and torch.is_grad_enabled():
        return _PushPullFunction.apply(tensor, average, name, priority, compression)
    return synchronize(push_pull_async(tensor, average, name, 0, priority, compression))
