"""A communication hook for torch's own ``DistributedDataParallel``: :func:`push_pull_hook`
and its state, :class:`PushPullHookState`, in the shape of torch's hooks
(``torch.distributed.algorithms.ddp_comm_hooks``: ``powerSGD_hook`` and ``PowerSGDState``).
Two lines turn a DDP script's all-reduce into pushpull's rounds, compression included::

    state = pushpull.torch.PushPullHookState(params={"compressor": "onebit", "ef": "vanilla"})
    model.register_comm_hook(state, pushpull.torch.push_pull_hook)

Each of DDP's gradient buckets is one pushpull tensor, averaged over the workers (the sum
divided by ``size()``, as DDP's default divides by the world size). Its name is stable from
step to step, so the compressor state that pushpull keeps per tensor (error feedback,
momentum) carries over; a bucket that DDP rebuilds gets a new name (see
:meth:`PushPullHookState.name_of`). The hook starts the round and returns at once; a thread
of this module completes the returned future when the round ends.

With a PowerSGD map (``{"compressor": "powersgd", "rank": "4"}``: torch's ``powerSGD_hook``
through pushpull's servers), the bucket's tensor is declared with the shapes of its gradients
(``pieces``): each gradient is compressed as its own matrix, as torch's hook does, and a step
takes one round of the bucket's ``P``s and one of its ``Q``s, as torch's takes one all-reduce
of each.

The hook hands DDP averaged gradients and never sees the optimizer. Onebit with error
feedback does not train when those gradients feed an optimizer with state of its own (SGD
with momentum, Adam): its state integrates the compression error. ``DistributedOptimizer``
averages Adam's momentum or the optimizer's updates instead (``average="momentum"`` or
``"updates"``, taken by itself for such a map); a hook cannot, so use ``DistributedOptimizer`` there, or onebit with plain SGD and the
map's ``momentum = nesterov`` (the BytePS RFC's recipe).

This module does not use ``from __future__ import annotations``: DDP compares the hook's
annotations with ``dist.GradBucket`` and ``torch.futures.Future[torch.Tensor]``, not
strings."""

import itertools
import queue
import threading
import zlib
from typing import Callable, Dict, List, Mapping, Optional, Tuple, Union

import torch
import torch.distributed as dist

from . import _state
from ._declare import _check_params, _ensure_declared, _with_pieces, declare
from ._push_pull import _start_sums, discard_last_round
from ._round import _Round
from .compression import compressor_of

# DDP checks a hook's annotations against these (torch built without torch.distributed has
# no GradBucket, and no DDP either).
_GradBucket = getattr(dist, "GradBucket", object)

ParamsOf = Union[None, Mapping[str, str], Callable[[_GradBucket], Optional[Mapping[str, str]]]]

# Default prefixes: the k-th state made in a process is "DDP.k" (the same on every worker
# when every worker makes its states in the same order).
_states = itertools.count()


class PushPullHookState:
    """The state of :func:`push_pull_hook`: the parameter map each bucket is declared with,
    and the names of the buckets' tensors.

    ``params``: ``None`` (uncompressed), one parameter map for every bucket (keys as in
    :func:`pushpull.torch.declare`, e.g. ``{"compressor": "onebit", "ef": "vanilla"}`` or
    ``{"byteps_compressor_type": "topk", "byteps_compressor_k": "0.01"}``), or a function of
    the bucket (a ``torch.distributed.GradBucket``: ``index()``, ``buffer()``,
    ``parameters()``) returning its map or ``None``. The function is called once per bucket
    name, when that tensor is declared: a bucket's map is then fixed.

    ``prefix``: the start of the buckets' tensor names (default ``DDP.k`` for the k-th state
    this process made). Give each hooked model its own state: two models sharing a state
    would share its bucket names and compressor state.

    ``bucket_names`` lists the names declared so far, in order (for
    :func:`pushpull.torch.metrics`, whose ``tensors`` are keyed by name)."""

    def __init__(self, params: ParamsOf = None, prefix: Optional[str] = None):
        if params is not None and not callable(params):
            if not isinstance(params, Mapping):
                raise TypeError(
                    f"PushPullHookState: params = {params!r}: expected a parameter map, a "
                    "function of the bucket returning one, or None"
                )
            _check_params(f"{prefix or 'DDP'}.*", params)
            params = dict(params)
        if prefix is not None and not isinstance(prefix, str):
            raise TypeError(f"PushPullHookState: prefix = {prefix!r}: expected a string")
        self.params = params
        self.prefix = prefix if prefix is not None else f"DDP.{next(_states)}"
        self.bucket_names: List[str] = []
        # The buckets hooked in the current step and their tensors, and whether a result of
        # that step came back not finite (set by the hook's thread; read at the next step's
        # first bucket, after DDP has waited for every future of the step).
        self._step_buckets: List[str] = []
        self._step: List[str] = []
        self._step_non_finite = False
        # Each bucket name's map, asked once.
        self._maps: Dict[str, Dict[str, str]] = {}

    def name_of(self, bucket) -> str:
        """The tensor name of ``bucket``: ``PREFIX.bucket.INDEX.LENGTH.LAYOUT``, where LAYOUT
        is a checksum of its parameters' shapes in bucket order. DDP rebuilds its buckets
        after the first step (in the order the gradients became ready, at ``bucket_cap_mb``):
        a rebuilt bucket that holds other parameters, or the same ones in another order, gets
        a new name and starts with fresh compressor state, while one that is unchanged keeps
        its name and state. The names of the buckets before a rebuild stay declared (their
        state is kept by the worker and servers, unused)."""
        shapes = ";".join(
            f"{tuple(p.shape)}{str(p.dtype).replace('torch.', '')}" for p in bucket.parameters()
        )
        layout = zlib.crc32(shapes.encode())
        return f"{self.prefix}.bucket.{bucket.index()}.{bucket.buffer().numel()}.{layout:08x}"

    def params_of(self, bucket) -> Dict[str, str]:
        """The parameter map ``bucket`` is declared with."""
        name = self.name_of(bucket)
        if name not in self._maps:
            p = self.params(bucket) if callable(self.params) else self.params
            self._maps[name] = dict(p or {})
        return self._maps[name]

    def __repr__(self) -> str:
        return f"PushPullHookState(params={self.params!r}, prefix={self.prefix!r})"


# The state of a hook registered with state=None or a process group: uncompressed, its own
# prefix.
_default: Optional[PushPullHookState] = None
# torch's process groups (torch's own hooks take one as their state).
_ProcessGroup = getattr(dist, "ProcessGroup", ())


def _state_of(state) -> PushPullHookState:
    """The hook state that ``state`` stands for: itself, or for ``None`` and for a process
    group of every worker (torch's hooks' state, e.g. ``dist.group.WORLD``) the default one."""
    global _default
    if isinstance(state, PushPullHookState):
        return state
    if state is None or isinstance(state, _ProcessGroup):
        if state is not None and state.size() != _state._w().num_workers:
            raise ValueError(
                f"push_pull_hook: state is a process group of {state.size()} ranks: pushpull "
                f"averages over every worker of its job ({_state._w().num_workers}); pass "
                "None, the world group, or a pushpull.torch.PushPullHookState"
            )
        if _default is None:
            _default = PushPullHookState(prefix="DDP.hook")
        return _default
    raise TypeError(
        f"push_pull_hook: state = {state!r}: expected a pushpull.torch.PushPullHookState, "
        "None or a torch.distributed process group of every worker"
    )


def push_pull_hook(
    state: Optional[PushPullHookState], bucket: _GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """DDP's communication hook on pushpull: ``model.register_comm_hook(state,
    push_pull_hook)``, with a :class:`PushPullHookState`, or ``None`` or a process group of
    every worker as torch's own hooks take (``dist.group.WORLD``): uncompressed.

    Push_pulls the bucket's flat gradient buffer, averaged over the workers, as the tensor
    ``state.name_of(bucket)`` (declared at its first round, a collective, with
    ``state.params_of(bucket)`` and the bucket's index as priority: higher indices hold
    earlier layers, which the next forward pass needs first). Returns a
    ``torch.futures.Future`` that a thread of this module completes with the buffer, which
    then holds the average, once the round ends; the autograd thread does not wait for it.
    A bucket name's first round declares its tensor, a collective that waits until every
    worker has declared it (the first step, and the step after DDP rebuilds its buckets). A
    failed round (e.g. a lost node) sets the future's exception, which DDP raises at the end
    of the backward pass.

    Buffers go where :func:`pushpull.torch.push_pull` sends them: a contiguous float32 CPU
    buffer is summed in place; a CUDA buffer is compressed on its GPU (ordered after the
    backward pass's stream; the future is made with that device, so DDP's use of the result
    waits for the worker's stream); float16 and bfloat16 buffers are widened to float32 and
    the average narrowed back, and travel as fp16 or bf16 where the state's map names no
    compressor: torch's own ``fp16_compress_wrapper(push_pull_hook)`` and
    ``bf16_compress_wrapper`` (``torch.distributed.algorithms.ddp_comm_hooks.default_hooks``)
    cast each bucket before the hook, and its round then carries half the bytes, as theirs
    around torch's hooks do.

    Uncompressed, the result is DDP's own with 2 workers bit for bit (each average is
    (a + b) / 2, exact), and with more the servers' rank-order float32 sum divided by the
    workers. Differences from torch's hooks: the average is the sum divided by the workers
    (``allreduce_hook`` divides first); a process group as ``state`` only stands for the
    default state (pushpull's rounds go through its own servers, over every worker: a group of
    some ranks is refused; DDP still needs a ``torch.distributed`` process group for its own
    setup, e.g. gloo); and error feedback works from the first step, rebuilt buckets
    included (``PowerSGDState`` needs ``start_powerSGD_iter > 1`` for that).

    With ``torch.amp.GradScaler``, a chunk that is not finite on some worker comes back NaN
    on every worker (so every scaler skips the step), and the step's rounds are discarded on
    every worker, as :class:`pushpull.torch.DistributedOptimizer` does: when a bucket of the
    state is hooked again (the next step), the rounds of every bucket of the step before are
    undone (:func:`pushpull.torch.discard_last_round`) if any of their results held inf or
    NaN (a step starts at bucket 0, as DDP reduces its buckets in index order), so the compressor state (error feedback, momentum) of the finite chunks does not keep
    a step that was never applied."""
    state = _state_of(state)
    buffer = bucket.buffer()
    name = state.name_of(bucket)
    if state._step_buckets and (bucket.index() == 0 or name in state._step_buckets):
        # DDP reduces its buckets in index order: bucket 0 (or a bucket hooked again) starts
        # a new step. A step whose result was not finite somewhere was
        # skipped by every worker's loss scaler: its rounds are discarded, here and on the
        # servers, as DistributedOptimizer does.
        if state._step_non_finite:
            discard_last_round(state._step)
        state._step_buckets, state._step, state._step_non_finite = [], [], False
    state._step_buckets.append(name)
    params = _travel_params(state.params_of(bucket), buffer)
    if compressor_of(params) == "powersgd":
        # torch's hook views each of the bucket's gradients as (shape[0], -1).
        params = _with_pieces(params, [g.shape for g in bucket.gradients()])
    if name not in _state.declared:
        declare(name, buffer, params, priority=bucket.index())
    if name not in state.bucket_names:
        state.bucket_names.append(name)
    r = _Round(name, buffer)
    _ensure_declared(name, r, 0)
    state._step.append(name)
    _start_sums([r], average=True)
    if buffer.is_cuda:
        fut = torch.futures.Future(devices=[buffer.device])
    else:
        fut = torch.futures.Future()
    _waiter.put(r, fut, state)
    return fut


# What a half-precision bucket travels as when its map names no compressor.
_HALF = {torch.float16: "fp16", torch.bfloat16: "bf16"}


def _travel_params(params: Dict[str, str], buffer: torch.Tensor) -> Dict[str, str]:
    """``params``, with the compressor of a half-precision ``buffer`` (torch's
    ``fp16_compress_wrapper`` / ``bf16_compress_wrapper`` cast the bucket before calling the
    hook) set to its precision where the map names none, so that the wrapper's halving of the
    bytes holds on pushpull's wire too."""
    half = _HALF.get(buffer.dtype)
    if half is None or "compressor" in params or "byteps_compressor_type" in params:
        return params
    return {**params, "compressor": half}


class _Waiter:
    """One daemon thread that waits for the hooks' rounds (the GIL released meanwhile), in
    the order they started, and completes their futures: DDP starts its buckets in order and
    waits for all of them at the end of the backward pass."""

    def __init__(self):
        self.queue: "queue.SimpleQueue[Tuple[_Round, torch.futures.Future, PushPullHookState]]" = (
            queue.SimpleQueue()
        )
        self.thread: Optional[threading.Thread] = None
        self.lock = threading.Lock()

    def put(self, r: _Round, fut: torch.futures.Future, state: PushPullHookState) -> None:
        with self.lock:
            if self.thread is None or not self.thread.is_alive():  # first use, or after fork
                self.queue = queue.SimpleQueue()
                self.thread = threading.Thread(
                    target=self.run, args=(self.queue,), name="pushpull-ddp-hook", daemon=True
                )
                self.thread.start()
            self.queue.put((r, fut, state))

    @staticmethod
    def run(q) -> None:
        while True:
            r, fut, state = q.get()
            try:
                # The bucket (a half-precision bucket narrowed back).
                result = r.finish()
                if not bool(torch.isfinite(result).all()):
                    state._step_non_finite = True
            except BaseException as e:  # noqa: BLE001 - handed to DDP through the future
                fut.set_exception(e)
            else:
                fut.set_result(result)


_waiter = _Waiter()
