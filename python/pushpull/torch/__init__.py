"""BytePS's PyTorch API on pushpull: ``import pushpull.torch as bps``.

The names and habits of ``byteps.torch`` (``init``, ``push_pull``, ``DistributedOptimizer``,
``broadcast_parameters``, ...), with pushpull's per-tensor compression on top: any tensor may
be declared with a parameter map of the Rust API's keys (``byteps_compressor_type``,
``byteps_compressor_k``, ``byteps_ef_type``, ``byteps_momentum_type``, ... or the short names
``compressor``, ``k``, ``ef``, ``momentum``), see :func:`declare` and
``DistributedOptimizer(..., compression_params=...)``.

Tensors
    Contiguous float32 CPU tensors are summed in place: their memory goes to the Rust worker
    by address and length (no copy), with the GIL released while the round runs, and the
    handle keeps the tensor alive until the round has finished writing. float64, float16 and
    bfloat16 tensors and non-contiguous CPU tensors go through a float32 CPU copy that is
    copied back at :func:`synchronize` (for float64 that rounds to float32 precision). Other
    dtypes (integers, bool, complex) raise ``TypeError`` naming the tensor.

CUDA tensors
    A CUDA tensor is compressed on its own GPU (``worker.device = "auto"``, the default; a
    ``worker.device = "cuda:N"`` refuses tensors on other GPUs, ``"cpu"`` copies them to the
    host): the worker's kernels read and write torch's memory in place, and only compressed
    payloads cross PCIe. The round runs on a stream of the worker's own, ordered after the
    work queued on the tensor's current stream when the call is made, and later work on the
    stream current at :func:`synchronize` is ordered after the result (CUDA events, no
    ``torch.cuda.synchronize()``); the memory is kept from torch's caching allocator until the
    worker's stream is done with it (``record_stream``). float16, bfloat16 and float64 CUDA
    tensors are widened to float32 on the GPU (exactly) and narrowed back at
    :func:`synchronize` (round to nearest even). A non-contiguous CUDA tensor raises
    ``ValueError`` naming it. A tensor's rounds stay on the GPU of its first round (its error
    feedback and momentum live there). Compressors without a GPU kernel (top-k, column-wise
    onebit, Elias-coded dithering) copy that tensor's chunks to the host. :func:`metrics`
    says where each tensor was compressed (``device``), how much GPU and page-locked memory
    the worker holds (``device_bytes``) and how many driver calls it made (``driver_calls``).
    Tensors handed over together (:func:`push_pull_group_async_inplace`,
    :class:`DistributedOptimizer`'s buckets) are compressed as one batch: a dozen driver calls
    however many tensors.

    The environment variable ``PUSHPULL_TORCH_ROUTE=emulated`` (a test aid; default ``host``)
    sends CPU float32 tensors through the same device path on the worker's emulated device
    (the CUDA kernels' host-compiled twin), so the GPU logic is checked without a GPU.

Names and declaration
    A tensor is declared once, by name, on every worker (a collective: every worker must
    declare the same name, length, parameter map and priority). :func:`push_pull` declares a
    tensor it has not seen; ``name=None`` takes ``push_pull.noname.N`` from a counter, which
    matches across workers only if every worker makes the same calls in the same order (as in
    BytePS).

Priorities
    A tensor's priority is fixed when it is declared: pushes (on every worker) and results (on
    every server) leave in priority order, higher first. The default is declaration order
    (earliest first), which is what BytePS does so that the next forward pass can start early;
    :class:`DistributedOptimizer` declares parameter ``i`` of ``named_parameters`` with priority
    ``-i``. The ``priority`` argument of a call is used when that call declares the tensor;
    ``0`` (the default) keeps declaration order. A non-zero ``priority`` that differs from the
    declared one raises ``ValueError``. Separate calls made at the same moment are sent in the
    order they reach the sender, which may differ between workers; tensors handed over
    together through :func:`push_pull_group_inplace` (or its async form) leave in priority
    order on every worker.

Mixed precision
    A gradient chunk holding inf or NaN (a loss scaler's overflow) on any worker comes back as
    NaN on every worker, its compressor state unchanged, so that every worker's
    ``torch.amp.GradScaler`` finds the overflow and skips the same step, as it would after an
    all-reduce. :class:`DistributedOptimizer` then discards the step's rounds on its own
    (:func:`discard_last_round`: error feedback and momentum return to what they were before
    the step, here and on the servers). Use the optimizer as with Horovod::

        scaler.scale(loss).backward()
        optimizer.synchronize()
        scaler.unscale_(optimizer)   # optional, e.g. to clip
        with optimizer.skip_synchronize():
            scaler.step(optimizer)
        scaler.update()

    (``scaler.step(optimizer)`` alone would check each worker's own gradients before they are
    averaged.) Error feedback and momentum hold scaled gradients, and pushpull does not rescale
    them: when the scale changes, the state carried over is off by that factor.

Failures
    Errors raise :class:`pushpull.PushPullError` (naming the tensor and the key or value);
    when a node is lost every waiting and later call raises :class:`pushpull.NodeLostError`
    naming it, instead of hanging.
"""

from __future__ import annotations

import atexit
import itertools
import os
import pickle
import sys
from typing import Dict, List, Mapping, Optional, Sequence, Tuple, Union

import torch

from .. import _native
from .._env import JoinSettings, join_settings
from .._native import NodeLostError, PushPullError

__all__ = [
    "Compression",
    "DistributedOptimizer",
    "NodeLostError",
    "PushPullError",
    "broadcast",
    "broadcast_object",
    "broadcast_optimizer_state",
    "broadcast_parameters",
    "declare",
    "discard_last_round",
    "init",
    "local_rank",
    "local_size",
    "metrics",
    "poll",
    "push_pull",
    "push_pull_async_inplace",
    "push_pull_group_async_inplace",
    "push_pull_group_inplace",
    "push_pull_inplace",
    "rank",
    "shutdown",
    "size",
    "synchronize",
]

ParamMap = Mapping[str, str]

_worker: Optional[_native.Worker] = None
_settings: Optional[JoinSettings] = None
_handles: Dict[int, "_Round"] = {}
_next_handle = itertools.count(1)
_noname = itertools.count()
_declared: Dict[str, Tuple[int, int]] = {}  # name -> (numel, priority)

_CONVERTIBLE = (torch.float32, torch.float64, torch.float16, torch.bfloat16)

# PUSHPULL_TORCH_ROUTE: where CPU float32 tensors are reduced ("host", or "emulated": the
# device path on the emulated device). Read at init().
_ROUTES = ("host", "emulated")
_route = "host"
# The worker's CUDA streams, as torch streams, by device name ("cuda:N").
_streams: Dict[str, "torch.cuda.ExternalStream"] = {}


# --- joining and leaving -----------------------------------------------------------------


def init(config: Optional[str] = None) -> None:
    """Joins the job: reads the cluster file ``config`` (default: ``PUSHPULL_CONFIG``) and the
    BytePS environment (see ``pushpull._env``), connects to the scheduler and waits until every
    node has registered. Calling it again does nothing.

    If the script ends without :func:`shutdown`, it runs at exit, unless the script ends with
    an uncaught exception: then the worker leaves without a clean finish, so that the other
    workers fail naming it instead of waiting for rounds it will never push."""
    global _worker, _settings, _route
    if _worker is not None:
        return
    route = os.environ.get("PUSHPULL_TORCH_ROUTE", "host")
    if route not in _ROUTES:
        raise ValueError(f"PUSHPULL_TORCH_ROUTE = {route!r}: expected one of {_ROUTES}")
    _route = route
    settings = join_settings(config)
    _worker = _native.Worker(**settings.worker_kwargs())
    _settings = settings
    previous_hook = sys.excepthook

    def note_uncaught(*exc_info):
        global _uncaught
        _uncaught = True
        previous_hook(*exc_info)

    sys.excepthook = note_uncaught
    atexit.register(_shutdown_at_exit)


def shutdown() -> None:
    """Leaves the job cleanly: waits for rounds in flight, tells the scheduler, and waits until
    every worker has finished (the job ends together)."""
    global _worker
    w = _worker
    if w is None:
        return
    _worker = None
    _handles.clear()
    _declared.clear()
    _streams.clear()
    w.finish()


_uncaught = False


def _shutdown_at_exit() -> None:
    if _worker is not None and not _uncaught:
        try:
            shutdown()
        except PushPullError:
            pass  # the job already failed; the script's own error says why


def _w() -> _native.Worker:
    if _worker is None:
        raise PushPullError("pushpull.torch.init() has not been called (or shutdown() has)")
    return _worker


def rank() -> int:
    """This worker's rank, ``0 .. size() - 1``."""
    return _w().rank


def size() -> int:
    """The number of workers of the job."""
    return _w().num_workers


def local_rank() -> int:
    """This worker's index on its host (``BYTEPS_LOCAL_RANK``, default 0)."""
    _w()
    return _settings.local_rank if _settings else 0


def local_size() -> int:
    """The number of workers on this host (``BYTEPS_LOCAL_SIZE``, default 1)."""
    _w()
    return _settings.local_size if _settings else 1


def metrics() -> dict:
    """This worker's counters: raw and payload bytes pushed and pulled, rounds, seconds spent
    compressing, waiting and decompressing, in total and per tensor (with each tensor's codecs
    and where it was compressed, ``device``: ``cpu``, ``cuda:N`` or ``emulated``); the GPU and
    page-locked memory the worker holds for device tensors (``device_bytes``) and the driver
    calls it made (``driver_calls``)."""
    return _w().metrics()


# --- declaring ---------------------------------------------------------------------------


def declare(
    name: str,
    tensor: Union[torch.Tensor, int],
    params: Optional[ParamMap] = None,
    priority: Optional[int] = None,
) -> None:
    """Declares tensor ``name`` (a tensor, or its number of elements) with the parameter map
    ``params`` (string keys and values, e.g. ``{"byteps_compressor_type": "topk",
    "byteps_compressor_k": "0.01", "byteps_ef_type": "vanilla"}``) and ``priority`` (default:
    declaration order). A collective: every worker makes the same declarations. A bad map
    raises :class:`PushPullError` naming the tensor and the key."""
    numel = tensor if isinstance(tensor, int) else tensor.numel()
    if params is not None:
        bad = [k for k, v in params.items() if not isinstance(k, str) or not isinstance(v, str)]
        if bad:
            raise TypeError(
                f"tensor {name!r}: parameter map keys and values must be strings, "
                f"not {bad[0]!r}: {params[bad[0]]!r}"
            )
    prio, _codecs = _w().declare(name, numel, dict(params) if params else None, priority)
    _declared[name] = (numel, prio)


def _ensure_declared(name: str, tensor: torch.Tensor, priority: int) -> None:
    known = _declared.get(name)
    if known is None:
        if _w().is_declared(name):
            raise PushPullError(f"tensor {name!r} was declared through another API")
        declare(name, tensor, None, priority if priority != 0 else None)
        return
    numel, declared_priority = known
    if priority != 0 and priority != declared_priority:
        raise ValueError(
            f"tensor {name!r} was declared with priority {declared_priority}; this call asks for "
            f"{priority} (a tensor's priority is fixed when it is declared)"
        )
    if tensor.numel() != numel:
        raise PushPullError(
            f"tensor {name!r} was declared with {numel} elements; this call passes a tensor of "
            f"{tensor.numel()} elements (shape {tuple(tensor.shape)})"
        )


# --- rounds ------------------------------------------------------------------------------


class _Round:
    """One round in flight: the native handle, the float32 tensor it works in (on the host, or
    in the memory of the device that compresses it), and the caller's tensor when that is a
    different one (copied back at synchronize)."""

    def __init__(self, name: str, tensor: torch.Tensor, host_only: bool = False):
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"tensor {name!r}: expected a torch.Tensor, got {type(tensor).__name__}")
        if tensor.dtype not in _CONVERTIBLE:
            raise TypeError(
                f"tensor {name!r} has dtype {tensor.dtype}: pushpull sums float32 "
                "(float64, float16 and bfloat16 are converted); integer, bool and complex tensors "
                "are not supported"
            )
        self.name = name
        self.native: Optional[_native.Handle] = None
        # Where it is compressed: None (the host path), "cuda:N" or "emulated".
        self.device: Optional[str] = None
        # The ordering shared by the rounds of one call on a GPU (_Ordering), if any.
        self.ordering = None
        if not host_only and tensor.device.type == "cuda":
            self.device = _w().cuda_route(tensor.device.index)
            if self.device is not None and not tensor.is_contiguous():
                raise ValueError(
                    f"tensor {name!r} is a non-contiguous CUDA tensor (shape {tuple(tensor.shape)}, "
                    f"strides {tensor.stride()}): hand in a contiguous tensor (e.g. .contiguous())"
                )
        elif not host_only and tensor.device.type == "cpu" and _route == "emulated":
            self.device = "emulated"
        direct = tensor.dtype == torch.float32 and tensor.is_contiguous()
        if self.device is None:
            direct = direct and tensor.device.type == "cpu"
        self.target = None if direct else tensor
        if direct:
            self.work = tensor.detach()
        elif self.device is not None:
            # Widened on the tensor's own device (exactly).
            self.work = tensor.detach().to(torch.float32).contiguous()
        else:
            self.work = tensor.detach().to("cpu", torch.float32).contiguous()

    def entry(self):
        w = self.work
        return (self.name, w, w.data_ptr(), w.numel())

    def start_broadcast(self, root: int) -> None:
        self.native = _w().broadcast(*self.entry(), root)

    def finish(self) -> torch.Tensor:
        assert self.native is not None
        self.native.wait()
        if self.ordering is not None:
            self.ordering.after()
        if self.target is not None:
            with torch.no_grad():
                self.target.copy_(self.work)
            return self.target
        return self.work


class _Ordering:
    """The rounds of one call on a GPU, ordered with torch's streams: they run on the worker's
    stream, and once they are done (their handles resolved: the decode is queued there) later
    work on the stream current then waits for it; once per call and stream, not per tensor
    (each wait is two driver calls)."""

    def __init__(self, stream):
        self.stream = stream
        self.ordered = set()  # the streams already made to wait

    def after(self) -> None:
        current = torch.cuda.current_stream(self.stream.device)
        if current.cuda_stream not in self.ordered:
            current.wait_stream(self.stream)
            self.ordered.add(current.cuda_stream)


def _worker_stream(device: str):
    """The worker's stream on ``device`` ("cuda:N") as a torch stream."""
    s = _streams.get(device)
    if s is None:
        s = torch.cuda.ExternalStream(_w().device_stream(device), device=torch.device(device))
        _streams[device] = s
    return s


def _start_sums(rounds: Sequence[_Round], average: bool) -> None:
    """Starts the push_pull rounds of ``rounds`` together: one native call per place (the
    host, a GPU, the emulated device), a group call (one batch on a device) where there are
    several."""
    by_place: Dict[Optional[str], List[_Round]] = {}
    for r in rounds:
        by_place.setdefault(r.device, []).append(r)
    for device, rs in by_place.items():
        entries = [r.entry() for r in rs]
        if device is None:
            if len(rs) == 1:
                natives = [_w().push_pull(*entries[0], average)]
            else:
                natives = _w().push_pull_group(entries, average)
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
            natives = _w().push_pull_group_device(entries, average, device)
            for r in rs:
                r.ordering = ordering
        for r, native in zip(rs, natives):
            r.native = native


def _register(r: _Round) -> int:
    h = next(_next_handle)
    _handles[h] = r
    return h


def push_pull_async_inplace(
    tensor: torch.Tensor, average: bool = True, name: Optional[str] = None, priority: int = 0
) -> int:
    """Starts summing ``tensor`` over every worker in place (the average with
    ``average=True``: the sum divided by ``size()``). Returns a handle for :func:`poll` and
    :func:`synchronize`; don't read or write the tensor until then."""
    name = name if name is not None else f"push_pull.noname.{next(_noname)}"
    r = _Round(name, tensor)
    _ensure_declared(name, tensor, priority)
    _start_sums([r], average)
    return _register(r)


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
        name = name if name is not None else f"push_pull.noname.{next(_noname)}"
        r = _Round(name, tensor)
        _ensure_declared(name, tensor, priority)
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
    (:class:`DistributedOptimizer` does it on its own when a step's result is not finite)."""
    _w().discard_last_round(list(names))


def poll(handle: int) -> bool:
    """Whether the round of ``handle`` has finished (then :func:`synchronize` returns at once)."""
    r = _handles.get(handle)
    if r is None:
        raise ValueError(f"unknown or already synchronized handle {handle}")
    return r.native.poll()


def synchronize(handle: int) -> torch.Tensor:
    """Waits for the round of ``handle`` (the GIL is released meanwhile) and returns its tensor,
    which now holds the result. Raises the round's error."""
    r = _handles.pop(handle, None)
    if r is None:
        raise ValueError(f"unknown or already synchronized handle {handle}")
    return r.finish()


def push_pull_inplace(
    tensor: torch.Tensor, average: bool = True, name: Optional[str] = None, priority: int = 0
) -> torch.Tensor:
    """:func:`push_pull_async_inplace` and :func:`synchronize`: returns ``tensor``."""
    return synchronize(push_pull_async_inplace(tensor, average, name, priority))


def push_pull(
    tensor: torch.Tensor, average: bool = True, name: Optional[str] = None, priority: int = 0
) -> torch.Tensor:
    """The sum (or average) of ``tensor`` over every worker, as a new tensor; ``tensor`` is
    unchanged. Every worker's result is bit-identical: servers add the workers' data in rank
    order, in float32."""
    return push_pull_inplace(tensor.detach().clone(), average, name, priority)


def broadcast(tensor: torch.Tensor, root_rank: int, name: Optional[str] = None) -> torch.Tensor:
    """Makes ``tensor`` equal to the ``root_rank`` worker's, bit for bit, in place, and returns
    it (a tensor's compressor is not used for broadcasts; CUDA tensors go through a host copy)."""
    name = name if name is not None else f"broadcast.noname.{next(_noname)}"
    r = _Round(name, tensor, host_only=True)
    _ensure_declared(name, tensor, 0)
    r.start_broadcast(root_rank)
    return r.finish()


def _named_tensors(params) -> List[Tuple[str, torch.Tensor]]:
    if isinstance(params, Mapping):
        return sorted(params.items())
    items = list(params)
    if items and not isinstance(items[0], tuple):
        return [(f"param.{i}", p) for i, p in enumerate(items)]
    return items


def broadcast_parameters(params, root_rank: int) -> None:
    """Makes every worker's parameters (a ``state_dict()``, ``named_parameters()``, or a list of
    tensors) equal to the ``root_rank`` worker's, in place. Floating tensors are broadcast in
    float32 rounds (declared ``Parameter.NAME``), all in flight at once; other tensors (e.g.
    BatchNorm's ``num_batches_tracked``) go through :func:`broadcast_object`."""
    floats, others = [], {}
    for name, p in _named_tensors(params):
        if p is None:
            continue
        if p.dtype in _CONVERTIBLE:
            floats.append((f"Parameter.{name}", p))
        else:
            others[name] = p
    rounds = []
    for name, p in floats:
        r = _Round(name, p.data if isinstance(p, torch.nn.Parameter) else p, host_only=True)
        _ensure_declared(name, p, 0)
        r.start_broadcast(root_rank)
        rounds.append(r)
    for r in rounds:
        r.finish()
    if others:
        got = broadcast_object(others, root_rank, name="Parameter.non_float")
        with torch.no_grad():
            for name, p in others.items():
                p.copy_(got[name])


def broadcast_optimizer_state(optimizer: torch.optim.Optimizer, root_rank: int) -> None:
    """Makes every worker's optimizer state (momentum buffers, step counts, hyperparameters)
    equal to the ``root_rank`` worker's: its ``state_dict()`` is broadcast with
    :func:`broadcast_object` and loaded on the others."""
    state = broadcast_object(optimizer.state_dict(), root_rank, name="optimizer_state")
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
    broadcast(header, root_rank, name=f"{name}.length")
    n = int(header[0]) | (int(header[1]) << 24)
    elems = max((n + 2) // 3, 1)
    body = torch.zeros(elems, dtype=torch.float32)
    if me == root_rank:
        b = torch.zeros(elems * 3, dtype=torch.int32)
        b[:n] = torch.frombuffer(bytearray(payload), dtype=torch.uint8).to(torch.int32)
        b = b.view(elems, 3)
        body.copy_(b[:, 0] | (b[:, 1] << 8) | (b[:, 2] << 16))
    broadcast(body, root_rank, name=f"{name}.bytes.{elems}")
    v = body.to(torch.int32)
    out = torch.stack([v & 0xFF, (v >> 8) & 0xFF, (v >> 16) & 0xFF], dim=1).reshape(-1)[:n]
    return pickle.loads(out.to(torch.uint8).numpy().tobytes())


# The optimizer and BytePS's compression choices (pushpull/torch/optimizer.py), on the rounds
# above.
from .optimizer import Compression, DistributedOptimizer, _buckets  # noqa: E402,F401
