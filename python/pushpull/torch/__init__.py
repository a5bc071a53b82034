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
    copied back at :func:`synchronize` (for float64 that rounds to float32 precision). Integer
    tensors (int8, uint8, int16, int32, int64) are summed exactly through a float32 host copy
    while every partial sum fits float32's integers (below 2**24; see :func:`push_pull`).
    bool and complex tensors raise ``TypeError`` naming the tensor.

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

BytePS and Horovod scripts
    The names, arguments and defaults of ``byteps.torch`` (``push_pull_async``,
    ``declare(name, **kwargs)``, ``version``, ``compression``, ``prefix``, ``suspend`` /
    ``resume``, :class:`DistributedOptimizer`'s ``set_backward_passes_per_step``,
    ``pushpull.torch.parallel.DistributedDataParallel``) and Horovod's spellings
    (:func:`allreduce` and its forms with ``op=Average`` / ``Sum``, :func:`allgather`,
    :func:`broadcast_`, :func:`broadcast_object`, :func:`join`, :func:`barrier`). Where
    pushpull cannot do what they do, the call says so instead of ignoring an argument:
    ``version`` and ``staleness`` other than 0 raise ``ValueError`` (rounds are synchronous),
    :func:`resume` with other sizes raises ``ValueError`` (no elastic resizing), ``op=Adasum``
    raises ``ValueError``; :func:`join` is a barrier (a joined worker does not stand in for
    others' rounds with zeros). Each function's docstring names its differences.

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
import weakref
from typing import Dict, List, Mapping, NamedTuple, Optional, Sequence, Tuple, Union

import torch

from .. import _native
from .._env import JoinSettings, join_settings
from .._native import NodeLostError, PushPullError
from .compression import Compression, _Compressor, check_compression, compressor_of

__all__ = [
    "Adasum",
    "Average",
    "Compression",
    "DistributedOptimizer",
    "NodeLostError",
    "PushPullError",
    "Sum",
    "allgather",
    "allgather_async",
    "allreduce",
    "allreduce_",
    "allreduce_async",
    "allreduce_async_",
    "barrier",
    "broadcast",
    "broadcast_",
    "broadcast_object",
    "broadcast_optimizer_state",
    "broadcast_parameters",
    "declare",
    "discard_last_round",
    "init",
    "join",
    "local_rank",
    "local_size",
    "metrics",
    "poll",
    "push_pull",
    "push_pull_async",
    "push_pull_async_inplace",
    "push_pull_group_async_inplace",
    "push_pull_group_inplace",
    "push_pull_inplace",
    "rank",
    "resume",
    "shutdown",
    "size",
    "suspend",
    "synchronize",
]

ParamMap = Mapping[str, str]

_worker: Optional[_native.Worker] = None
_settings: Optional[JoinSettings] = None
_handles: Dict[int, "_Round"] = {}
_next_handle = itertools.count(1)
_noname = itertools.count()


class _Decl(NamedTuple):
    """A tensor declared on this worker: its length in float32 elements (twice the elements
    of an integer tensor), priority, parameter map and each chunk's codec."""

    numel: int
    priority: int
    params: Dict[str, str]
    codecs: List[str]


_declared: Dict[str, _Decl] = {}
# Names declared with BytePS's declare(name, **kwargs), before their first round: the
# parameter map and priority they will be declared with.
_pending: Dict[str, Tuple[Dict[str, str], Optional[int]]] = {}
# Every round started and not yet dropped (for suspend()), and whether rounds are suspended.
_live: "weakref.WeakSet[_Round]" = weakref.WeakSet()
_suspended = False

_CONVERTIBLE = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
_INTEGER = (torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64)
# Integers are summed in float32, which holds every integer of magnitude up to 2**24.
_EXACT_LIMIT = float(2**24)

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
    global _worker, _suspended
    w = _worker
    if w is None:
        return
    _worker = None
    _suspended = False
    _handles.clear()
    _declared.clear()
    _pending.clear()
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


def _param_str(name: str, key: str, v) -> str:
    """A keyword argument of BytePS's ``declare(name, **kwargs)`` as a map value: strings as
    they are, booleans as ``true``/``false``, numbers in Python's spelling."""
    if isinstance(v, str):
        return v
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return str(v)
    raise TypeError(f"tensor {name!r}: {key} = {v!r}: expected a string, a number or a bool")


def _check_params(name: str, params: Mapping[str, str]) -> None:
    bad = [k for k, v in params.items() if not isinstance(k, str) or not isinstance(v, str)]
    if bad:
        raise TypeError(
            f"tensor {name!r}: parameter map keys and values must be strings, "
            f"not {bad[0]!r}: {params[bad[0]]!r}"
        )


def _check_sync_args(version, staleness=0) -> None:
    """BytePS's ``version`` and ``staleness`` arguments: pushpull's rounds are synchronous,
    so only 0 is meaningful; anything else raises ``ValueError`` naming the argument."""
    if version != 0:
        raise ValueError(
            f"version = {version!r}: pushpull's rounds are synchronous (every round of a tensor "
            "sums the same step of every worker); only version=0 is supported"
        )
    if staleness != 0:
        raise ValueError(
            f"staleness = {staleness!r}: pushpull has no pipelined (stale) rounds; only "
            "staleness=0 is supported"
        )


def _native_numel(tensor: torch.Tensor) -> int:
    """The float32 elements a round of ``tensor`` carries: an integer tensor's values and
    their magnitudes (see "Integer tensors" in :func:`push_pull`)."""
    n = tensor.numel()
    return 2 * n if tensor.dtype in _INTEGER else n


def declare(
    name: str,
    tensor: Union[torch.Tensor, int, None] = None,
    params: Optional[ParamMap] = None,
    priority: Optional[int] = None,
    **kwargs,
) -> None:
    """Declares tensor ``name`` with the parameter map ``params`` (string keys and values,
    e.g. ``{"byteps_compressor_type": "topk", "byteps_compressor_k": "0.01",
    "byteps_ef_type": "vanilla"}``) and ``priority`` (default: declaration order).

    Two forms:

    * pushpull's, ``declare(name, tensor, params, priority)``: ``tensor`` is the tensor (or
      its number of float32 elements; an integer tensor of n elements takes 2n, see
      :func:`push_pull`), and the tensor is declared now. A collective: every worker makes the
      same declarations. A bad map raises :class:`PushPullError` naming the tensor and the key.
    * BytePS's, ``declare(name, **kwargs)``: without a tensor the length is not known yet, so
      the name is declared for real at its first round (a collective then), with ``kwargs`` as
      its parameter map: ``declare("Gradient.fc", byteps_compressor_type="onebit",
      byteps_ef_type="vanilla")``. Values may be strings, numbers or booleans (BytePS passes
      ``byteps_seed`` as an int). BytePS's ``staleness`` keyword is accepted as 0 only
      (``ValueError`` otherwise). Declaring a name again with the same map does nothing; with
      a different map it raises ``ValueError``.

    ``kwargs`` also add to ``params`` in the first form."""
    if not isinstance(name, str):
        raise TypeError(f"declare: name = {name!r}: expected a string")
    _check_sync_args(0, kwargs.pop("staleness", 0))
    cmap: Dict[str, str] = {}
    if params is not None:
        _check_params(name, params)
        cmap.update(params)
    for k, v in kwargs.items():
        cmap[k] = _param_str(name, k, v)
    known = _declared.get(name)
    if tensor is None:
        if known is not None:
            if cmap and cmap != known.params:
                raise ValueError(
                    f"tensor {name!r} was declared with the map {known.params}; this call asks "
                    f"for {cmap} (a tensor's map is fixed when it is declared)"
                )
            return
        pending = _pending.get(name)
        if pending is not None and pending != (cmap, priority):
            raise ValueError(
                f"tensor {name!r} was declared with the map {pending[0]} and priority "
                f"{pending[1]}; this call asks for {cmap} and {priority}"
            )
        _pending[name] = (cmap, priority)
        return
    pending = _pending.pop(name, None)
    if pending is not None:
        cmap = {**pending[0], **cmap}
        priority = pending[1] if priority is None else priority
    numel = tensor if isinstance(tensor, int) else _native_numel(tensor)
    _check_running("declare")
    prio, codecs = _w().declare(name, numel, cmap or None, priority)
    _declared[name] = _Decl(numel, prio, cmap, list(codecs))


def _ensure_declared(
    name: str, r: "_Round", priority: int, compression: Optional[_Compressor] = None
) -> None:
    """Declares the tensor of round ``r`` if it is new (with the map of a pending
    ``declare(name, **kwargs)`` and ``compression``'s), else checks the call against the
    declaration: length, priority, compressor, and for integers an uncompressed map."""
    numel = r.work.numel()
    cmap = compression.params if compression is not None else {}
    known = _declared.get(name)
    if known is None:
        if _w().is_declared(name):
            raise PushPullError(f"tensor {name!r} was declared through another API")
        pmap, pprio = _pending.get(name, ({}, None))
        if cmap and compressor_of(pmap) not in ("none", compressor_of(cmap)):
            raise ValueError(
                f"tensor {name!r} was declared with compressor {compressor_of(pmap)!r}; "
                f"compression={compression!r} asks for {compressor_of(cmap)!r}"
            )
        if r.integer and (pmap or cmap):
            raise ValueError(
                f"integer tensor {name!r} ({r.dtype}) is summed exactly, uncompressed: declare "
                f"it without a parameter map and push it with Compression.none, not "
                f"{pmap or cmap}"
            )
        _pending.pop(name, None)
        prio = pprio if pprio is not None else (priority if priority != 0 else None)
        declare(name, numel, {**pmap, **cmap}, prio)
        known = _declared[name]
    else:
        if priority != 0 and priority != known.priority:
            raise ValueError(
                f"tensor {name!r} was declared with priority {known.priority}; this call asks "
                f"for {priority} (a tensor's priority is fixed when it is declared)"
            )
        if numel != known.numel:
            doubled = " (an integer tensor of n elements takes 2n)" if r.integer else ""
            raise PushPullError(
                f"tensor {name!r} was declared with {known.numel} float32 elements; this call "
                f"passes a {r.dtype} tensor of {r.numel} elements (shape {r.shape}), "
                f"{numel} float32 elements{doubled}"
            )
        if cmap and compressor_of(known.params) != compressor_of(cmap):
            raise ValueError(
                f"tensor {name!r} was declared with compressor {compressor_of(known.params)!r}; "
                f"compression={compression!r} asks for {compressor_of(cmap)!r} (a tensor's "
                "compressor is fixed when it is declared)"
            )
    if r.integer:
        lossy = sorted({c for c in known.codecs if c not in ("none", "fp32")})
        if known.params or lossy:
            raise ValueError(
                f"integer tensor {name!r} ({r.dtype}) is summed exactly, uncompressed, but it "
                f"was declared with the map {known.params} (codecs {lossy or known.codecs})"
            )


def _check_running(what: str) -> None:
    if _suspended:
        raise PushPullError(
            f"{what}: pushpull.torch is suspended (suspend()); call resume(...) first"
        )


# --- rounds ------------------------------------------------------------------------------


class _Round:
    """One round in flight: the native handle, the float32 tensor it works in (on the host, or
    in the memory of the device that compresses it), and the caller's tensor when that is a
    different one (copied back at synchronize).

    An integer tensor's round works in a float32 host tensor of twice its length: its values,
    then their magnitudes, whose sums say whether the values' sums were exact (every partial
    sum of an element is at most the sum of its magnitudes)."""

    def __init__(self, name: str, tensor: torch.Tensor, host_only: bool = False):
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"tensor {name!r}: expected a torch.Tensor, got {type(tensor).__name__}")
        if tensor.dtype not in _CONVERTIBLE and tensor.dtype not in _INTEGER:
            raise TypeError(
                f"tensor {name!r} has dtype {tensor.dtype}: pushpull sums float32 "
                "(float64, float16 and bfloat16 are converted; int8, uint8, int16, int32 and "
                "int64 are summed exactly below 2**24); bool and complex tensors are not supported"
            )
        self.name = name
        self.tensor = tensor  # what synchronize returns (in place: the caller's own tensor)
        self.dtype = tensor.dtype
        self.numel = tensor.numel()
        self.shape = tuple(tensor.shape)
        self.native: Optional[_native.Handle] = None
        # Where it is compressed: None (the host path), "cuda:N" or "emulated".
        self.device: Optional[str] = None
        # The ordering shared by the rounds of one call on a GPU (_Ordering), if any.
        self.ordering = None
        # Integers: averaged here (floor division), after the exact sum.
        self.integer = tensor.dtype in _INTEGER
        self.int_average = False
        # A factor applied to the result at synchronize (Horovod's postscale_factor).
        self.scale = 1.0
        if self.integer:
            flat = tensor.detach().reshape(-1).to("cpu", torch.float64)
            self.target = tensor
            self.work = torch.cat([flat, flat.abs()]).to(torch.float32)
            return
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
        _check_running(f"broadcast of {self.name!r}")
        self.native = _w().broadcast(*self.entry(), root)
        _live.add(self)

    def _integer_result(self) -> torch.Tensor:
        n = self.numel
        values, magnitudes = self.work[:n], self.work[n:]
        if n and float(magnitudes.max()) >= _EXACT_LIMIT:
            i = int(torch.argmax(magnitudes))
            raise ValueError(
                f"integer tensor {self.name!r} ({self.dtype}): element {i} has magnitudes summing "
                f"to {float(magnitudes[i]):.0f} over the workers (for a broadcast, the root's), "
                "not below 2**24 = 16777216, so its float32 sum may not be exact; the tensor is "
                "unchanged (split the values, or send them as float64 bytes via broadcast_object)"
            )
        s = values.to(torch.int64)
        if self.int_average:
            s = torch.div(s, size(), rounding_mode="floor")
        with torch.no_grad():
            # int64 -> the dtype wraps modulo 2**bits, as a sum in that dtype would.
            self.target.copy_(s.view(self.target.shape).to(self.target.dtype))
        return self.target

    def finish(self) -> torch.Tensor:
        assert self.native is not None
        self.native.wait()
        if self.ordering is not None:
            self.ordering.after()
        if self.integer:
            return self._integer_result()
        if self.scale != 1.0:
            with torch.no_grad():
                self.work.mul_(self.scale)
        if self.target is not None:
            with torch.no_grad():
                self.target.copy_(self.work)
        return self.tensor


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
    several. Integer rounds are summed (their average is taken at synchronize)."""
    _check_running("push_pull")
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
            _live.add(r)


def _register(r: _Round) -> int:
    h = next(_next_handle)
    _handles[h] = r
    return h


def _new_name(kind: str) -> str:
    return f"{kind}.noname.{next(_noname)}"


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
    when they differ). Integer tensors: see :func:`push_pull`."""
    _check_sync_args(version, staleness)
    check_compression(compression)
    name = name if name is not None else _new_name("push_pull")
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


def broadcast(tensor: torch.Tensor, root_rank: int, name: Optional[str] = None) -> torch.Tensor:
    """Makes ``tensor`` equal to the ``root_rank`` worker's, bit for bit, in place, and returns
    it (a tensor's compressor is not used for broadcasts; CUDA tensors go through a host copy).
    Integer tensors are exact while the root's values are below 2**24 in magnitude (else every
    worker raises ``ValueError`` naming the tensor; see :func:`push_pull`). In place, as
    BytePS's; Horovod's out-of-place ``broadcast`` is not offered (its in-place form is
    :func:`broadcast_`)."""
    name = name if name is not None else _new_name("broadcast")
    r = _Round(name, tensor, host_only=True)
    _ensure_declared(name, r, 0)
    r.start_broadcast(root_rank)
    return r.finish()


def broadcast_(tensor: torch.Tensor, root_rank: int, name: Optional[str] = None) -> torch.Tensor:
    """Horovod's in-place broadcast: :func:`broadcast`."""
    return broadcast(tensor, root_rank, name)


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


# --- suspend and resume --------------------------------------------------------------------


def suspend() -> None:
    """BytePS's ``suspend()``, without elastic training: waits for every round in flight (their
    handles stay valid: :func:`synchronize` still returns, or raises, their outcome), then
    refuses new rounds and declarations (:class:`PushPullError` naming the call) until
    :func:`resume`. The worker stays in the job (pushpull has no elastic mode: the job's
    workers and servers are fixed at :func:`init`); other workers' rounds wait for this one
    meanwhile."""
    global _suspended
    _w()
    for r in list(_live):
        if r.native is not None:
            try:
                r.native.wait()
            except PushPullError:
                pass  # raised again by the round's synchronize
    _suspended = True


def resume(num_workers: int, num_servers: int, global_rank: Optional[int] = None, context=None) -> None:
    """BytePS's ``resume(num_workers, num_servers, global_rank=None, context=None)`` after
    :func:`suspend`: with the job's own sizes, rounds may start again. ``num_workers`` counts
    worker hosts, as BytePS's (``DMLC_NUM_WORKER``: ``size() // local_size()`` here),
    ``num_servers`` the servers, ``global_rank`` (if given) must be :func:`rank`. Different
    values raise ``ValueError`` naming what differs: elastic resizing is not supported (the
    job's nodes are fixed at :func:`init`). ``context`` is accepted and unused. Calling it
    without :func:`suspend` does nothing beyond the checks."""
    global _suspended
    w = _w()
    hosts = w.num_workers // local_size()
    wrong = []
    if num_workers != hosts:
        wrong.append(f"num_workers = {num_workers!r} (this job's worker hosts: {hosts}, "
                     f"{local_size()} workers each, size() = {w.num_workers})")
    if num_servers != w.num_servers:
        wrong.append(f"num_servers = {num_servers!r} (this job: {w.num_servers})")
    if global_rank is not None and global_rank != w.rank:
        wrong.append(f"global_rank = {global_rank!r} (this worker: rank {w.rank})")
    if wrong:
        raise ValueError(
            "resume: " + "; ".join(wrong) + ": elastic resizing is not supported (the job's "
            "workers, servers and ranks are fixed at init())"
        )
    _suspended = False


# The optimizer (pushpull/torch/optimizer.py), Horovod's names (pushpull/torch/horovod.py) and
# DistributedDataParallel (pushpull/torch/parallel/), on the rounds above.
from .optimizer import DistributedOptimizer, _buckets  # noqa: E402,F401
from .horovod import (  # noqa: E402,F401
    Adasum,
    Average,
    Sum,
    allgather,
    allgather_async,
    allreduce,
    allreduce_,
    allreduce_async,
    allreduce_async_,
    barrier,
    join,
)
from . import parallel  # noqa: E402,F401
