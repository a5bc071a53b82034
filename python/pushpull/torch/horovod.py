"""Horovod's spellings in :mod:`pushpull.torch` (``import pushpull.torch as hvd`` works for
these): ``allreduce`` and its in-place and async forms with ``op=Average`` / ``Sum`` (and
``Min`` / ``Max`` / ``Product``, reduced from an allgather),
``grouped_allreduce(_)``, ``allgather``, ``allgather_object``, ``join`` and ``barrier``, each
a thin name over the rounds of
``pushpull/torch/_push_pull.py``; ``process_set=`` on each (the global set only:
:class:`ProcessSet`, :data:`global_process_set`); Horovod's exception names
(:data:`HorovodInternalError`, :class:`HostsUpdatedInterrupt`); its build queries (``nccl_built``
and the like, False but ``cuda_built``) and ``start_timeline`` / ``stop_timeline`` (refused,
naming how pushpull's timeline is set)."""

from __future__ import annotations

import pickle
import time
import zlib
from typing import Any, List, Optional, Sequence

import torch

from ._declare import _check_sync_args, _ensure_declared
from ._push_pull import (
    _new_name,
    _register,
    _start_sums,
    push_pull,
    push_pull_group_inplace,
    push_pull_inplace,
    synchronize,
)
from ._round import _CONVERTIBLE, _INTEGER, _Round
from . import _state
from ._state import _check_running, _w, rank, size
from .compression import Compression, _Compressor
from .._native import PushPullError

# --- Horovod's names -------------------------------------------------------------------------

# Horovod's reduction ops (its ReduceOp values).
Average = 0
Sum = 1
Adasum = 2
Min = 3
Max = 4
Product = 5

# The ops reduced from an allgather of every worker's tensor (the servers only sum): each
# one's name and its reduction over the gathered dimension.
_BY_GATHER = {
    Min: ("Min", lambda g: torch.amin(g, dim=0)),
    Max: ("Max", lambda g: torch.amax(g, dim=0)),
    Product: ("Product", lambda g: torch.prod(g, dim=0)),
}


# Horovod's exceptions. Every pushpull failure raises PushPullError (NodeLostError when the job
# is over), a RuntimeError as Horovod's HorovodInternalError is: catching either name catches
# them all.
HorovodInternalError = PushPullError


class HostsUpdatedInterrupt(RuntimeError):
    """Horovod's elastic interrupt (hosts were added or removed). pushpull never raises it: a
    job's workers and servers are fixed at :func:`init`. The name exists so that scripts that
    catch it run unchanged."""


class ProcessSet:
    """Horovod's process set: the ranks a collective runs over. pushpull reduces over every
    worker of the job, so only the global set is accepted: :data:`global_process_set` (or
    ``None``, or a set whose ``ranks`` are all the ranks); a call given another set raises
    ``ValueError`` naming it."""

    def __init__(self, ranks=None):
        self.ranks = None if ranks is None else sorted(int(r) for r in ranks)

    def included(self) -> bool:
        """Whether this worker is in the set (always, for the global set)."""
        return self.ranks is None or rank() in self.ranks

    def size(self) -> int:
        """The number of workers in the set."""
        return size() if self.ranks is None else len(self.ranks)

    def __repr__(self) -> str:
        return "global_process_set" if self.ranks is None else f"ProcessSet({self.ranks})"


# Every worker of the job: the one process set pushpull runs collectives over.
global_process_set = ProcessSet()


def _check_process_set(process_set, fn: str) -> None:
    if process_set is None or process_set.ranks is None:
        return
    if process_set.ranks == list(range(size())):
        return
    raise ValueError(
        f"{fn}: process_set = {process_set!r}: pushpull runs every collective over all "
        f"{size()} workers of the job (global_process_set); sets of some ranks are not supported"
    )


def _average_of(op, average, fn: str) -> bool:
    if op is not None and average is not None:
        raise ValueError(f"{fn}: give op (Average or Sum) or the deprecated average, not both")
    if op is None:
        return True if average is None else bool(average)
    if op == Average:
        return True
    if op == Sum:
        return False
    raise ValueError(f"{fn}: op = {op!r}: pushpull reduces with Average, Sum, Min, Max or "
                     "Product (Adasum is not supported)")


def _gathered_async(fn: str, tensor: torch.Tensor, op: int, name: Optional[str],
                    target: Optional[torch.Tensor], prescale: float, postscale: float) -> int:
    """``op`` (Min, Max or Product) of every worker's ``tensor``: an :func:`allgather_async`
    of it (each worker's values carried as they are: exact for integers below 2**24 and for
    float32, float16 and bfloat16; float64 through float32), reduced on this worker at
    :func:`synchronize` into ``target`` (the caller's tensor) or a new tensor of its dtype."""
    label, reduce = _BY_GATHER[op]
    if prescale != 1.0 or postscale != 1.0:
        raise ValueError(f"{fn}: prescale_factor = {prescale}, postscale_factor = {postscale}: "
                         f"scale factors apply to Average and Sum, not {label}")
    x = tensor.detach()
    h = allgather_async(x.reshape(1, *x.shape),
                        name=name if name is not None else _new_name(f"allreduce.{label}"))

    def then(gathered, shape=x.shape, dtype=x.dtype):
        reduced = reduce(gathered).to(dtype).reshape(shape)
        if target is None:
            return reduced
        with torch.no_grad():
            target.copy_(reduced)
        return target

    _state.handles[h].then = then
    return h


def _check_scales(fn: str, tensor: torch.Tensor, prescale: float, postscale: float) -> None:
    if (prescale != 1.0 or postscale != 1.0) and tensor.dtype in _INTEGER:
        raise ValueError(
            f"{fn}: prescale_factor = {prescale}, postscale_factor = {postscale}: scale factors "
            f"apply to floating tensors, and this one is {tensor.dtype}"
        )


def allreduce_async_(
    tensor: torch.Tensor,
    average: Optional[bool] = None,
    name: Optional[str] = None,
    op: Optional[int] = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: Optional[ProcessSet] = None,
) -> int:
    """Horovod's in-place async allreduce: :func:`push_pull_async_inplace` with ``op``
    (``Average``, the default, or ``Sum``; ``Adasum`` raises ``ValueError``) or the deprecated
    ``average``. ``prescale_factor`` multiplies ``tensor`` before the round,
    ``postscale_factor`` the result (at :func:`synchronize`), floating tensors only.

    The call is checked (dtype, declaration, suspended) before ``tensor`` is scaled, so a
    call that raises leaves it unchanged. The scaling is done in the float32 the round works
    in: float16 and bfloat16 tensors are widened first (the product rounded once, to float32,
    not to the tensor's dtype), float64 tensors are scaled in float64 and then rounded to
    float32. ``process_set``: the global set only (:class:`ProcessSet`).

    ``Min``, ``Max`` and ``Product`` gather every worker's tensor (:func:`allgather`, exact in
    the tensor's dtype but for float64, carried as float32) and reduce it here: one round of
    ``size()`` times the tensor, without scale factors."""
    _check_process_set(process_set, "allreduce_async_")
    if op in _BY_GATHER and average is None:
        return _gathered_async("allreduce_async_", tensor, op, name, tensor, prescale_factor,
                               postscale_factor)
    avg = _average_of(op, average, "allreduce_async_")
    _check_scales("allreduce_async_", tensor, prescale_factor, postscale_factor)
    name = name if name is not None else _new_name("allreduce")
    r = _Round(name, tensor)
    _ensure_declared(name, r, 0)
    _check_running("allreduce_async_")
    if prescale_factor != 1.0:
        with torch.no_grad():
            if r.target is not None and tensor.dtype == torch.float64:
                r.work.copy_(tensor.detach() * prescale_factor)
            else:
                # The caller's float32 tensor itself (in place), or its float32 copy.
                r.work.mul_(prescale_factor)
    r.scale = float(postscale_factor)
    _start_sums([r], avg)
    return _register(r)


def allreduce_async(
    tensor: torch.Tensor,
    average: Optional[bool] = None,
    name: Optional[str] = None,
    op: Optional[int] = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: Optional[ProcessSet] = None,
) -> int:
    """Horovod's async allreduce, out of place: :func:`allreduce_async_` of a copy of
    ``tensor`` (which is not modified); :func:`synchronize` returns the result."""
    _check_process_set(process_set, "allreduce_async")
    if op in _BY_GATHER and average is None:
        return _gathered_async("allreduce_async", tensor, op, name, None, prescale_factor,
                               postscale_factor)
    return allreduce_async_(
        tensor.detach().clone(), average, name, op, prescale_factor, postscale_factor
    )


def allreduce_(
    tensor: torch.Tensor,
    average: Optional[bool] = None,
    name: Optional[str] = None,
    op: Optional[int] = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: Optional[ProcessSet] = None,
) -> torch.Tensor:
    """Horovod's in-place allreduce: :func:`allreduce_async_` and :func:`synchronize`;
    returns ``tensor``."""
    return synchronize(
        allreduce_async_(
            tensor, average, name, op, prescale_factor, postscale_factor, process_set
        )
    )


def allreduce(
    tensor: torch.Tensor,
    average: Optional[bool] = None,
    name: Optional[str] = None,
    compression: _Compressor = Compression.none,
    op: Optional[int] = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: Optional[ProcessSet] = None,
) -> torch.Tensor:
    """Horovod's allreduce: :func:`push_pull` (a new tensor, gradients flow back) with ``op``
    (``Average``, the default, or ``Sum``) or the deprecated ``average``, ``compression`` as in
    :func:`push_pull_async_inplace`, and the scale factors of :func:`allreduce_async_`;
    ``process_set``: the global set only. ``Min``, ``Max`` and ``Product`` as in
    :func:`allreduce_async_` (their result has no autograd graph)."""
    _check_process_set(process_set, "allreduce")
    if op in _BY_GATHER and average is None:
        return synchronize(_gathered_async("allreduce", tensor, op, name, None,
                                           prescale_factor, postscale_factor))
    avg = _average_of(op, average, "allreduce")
    _check_scales("allreduce", tensor, prescale_factor, postscale_factor)
    x = tensor * prescale_factor if prescale_factor != 1.0 else tensor
    out = push_pull(x, avg, name, compression=compression)
    return out * postscale_factor if postscale_factor != 1.0 else out


def grouped_allreduce_(
    tensors: Sequence[torch.Tensor],
    average: Optional[bool] = None,
    name: Optional[str] = None,
    op: Optional[int] = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: Optional[ProcessSet] = None,
) -> List[torch.Tensor]:
    """Horovod's in-place ``grouped_allreduce_``: :func:`allreduce_` of every tensor of
    ``tensors`` started together as one group (:func:`push_pull_group_inplace`: the chunks
    leave in the tensors' priority order on every worker), named ``NAME.0``, ``NAME.1``, ...;
    returns the tensors. ``op`` and ``average`` as in :func:`allreduce_`; the scale factors
    (floating tensors only) multiply each tensor in its own dtype. ``Min``, ``Max`` and
    ``Product`` reduce each tensor as :func:`allreduce_async_` does."""
    _check_process_set(process_set, "grouped_allreduce_")
    tensors = list(tensors)
    if op in _BY_GATHER and average is None:
        base = name if name is not None else _new_name("grouped_allreduce")
        handles = [_gathered_async("grouped_allreduce_", t, op, f"{base}.{i}", t,
                                   prescale_factor, postscale_factor)
                   for i, t in enumerate(tensors)]
        return [synchronize(h) for h in handles]
    avg = _average_of(op, average, "grouped_allreduce_")
    for t in tensors:
        _check_scales("grouped_allreduce_", t, prescale_factor, postscale_factor)
    base = name if name is not None else _new_name("grouped_allreduce")
    if prescale_factor != 1.0:
        with torch.no_grad():
            for t in tensors:
                t.mul_(prescale_factor)
    names = [f"{base}.{i}" for i in range(len(tensors))]
    out = push_pull_group_inplace(tensors, avg, names)
    if postscale_factor != 1.0:
        with torch.no_grad():
            for t in out:
                t.mul_(postscale_factor)
    return out


def grouped_allreduce(
    tensors: Sequence[torch.Tensor],
    average: Optional[bool] = None,
    name: Optional[str] = None,
    op: Optional[int] = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: Optional[ProcessSet] = None,
) -> List[torch.Tensor]:
    """Horovod's ``grouped_allreduce``, out of place: :func:`grouped_allreduce_` of copies of
    ``tensors`` (which are not modified); returns the results as new tensors (without an
    autograd graph, unlike :func:`allreduce`)."""
    copies = [t.detach().clone() for t in tensors]
    return grouped_allreduce_(
        copies, average, name, op, prescale_factor, postscale_factor, process_set
    )


def allgather_object(obj: Any, name: Optional[str] = None,
                     process_set: Optional[ProcessSet] = None) -> List[Any]:
    """Horovod's ``allgather_object``: every worker's ``obj`` (anything ``pickle`` can carry),
    as a list in rank order. Two :func:`allgather` rounds, ``NAME.size`` and ``NAME.data``:
    the pickles' lengths, then their bytes."""
    _check_process_set(process_set, "allgather_object")
    name = name if name is not None else _new_name("allgather_object")
    data = torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8)
    sizes = allgather(torch.tensor([data.numel()], dtype=torch.int64), name=f"{name}.size")
    gathered = allgather(data, name=f"{name}.data")
    out, at = [], 0
    for n in sizes.tolist():
        out.append(pickle.loads(gathered[at:at + n].numpy().tobytes()))
        at += n
    return out


# Dtypes an allgather may carry, numbered from 1 in its header (0: not supported).
_GATHERABLE = _CONVERTIBLE + _INTEGER


def _split24(v: int) -> List[float]:
    return [float(v & 0xFFFFFF), float(v >> 24)]


def allgather_async(
    tensor: torch.Tensor,
    same_shape=True,
    name: Optional[str] = None,
    version: int = 0,
    priority: int = 0,
    process_set: Optional[ProcessSet] = None,
) -> int:
    """Starts :func:`allgather`; returns a handle whose :func:`synchronize` returns the
    concatenation. The first dimensions are gathered before this returns (a short round)."""
    _check_process_set(process_set, "allgather_async")
    if isinstance(same_shape, str) and name is None:
        name, same_shape = same_shape, True  # Horovod's allgather_async(tensor, name)
    _check_sync_args(version)
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"allgather: tensor = {tensor!r}: expected a torch.Tensor")
    name = name if name is not None else _new_name("allgather")
    x = tensor.detach()
    if x.dim() == 0:
        x = x.reshape(1)
    n, me = size(), rank()
    trailing = tuple(x.shape[1:])
    row = 1
    for d in trailing:
        row *= d
    code = _GATHERABLE.index(x.dtype) + 1 if x.dtype in _GATHERABLE else 0
    shape_id = zlib.crc32(repr(trailing).encode())
    # Every rank's header in its own slot of a sum (the other slots zero: exact).
    fields = [x.shape[0], row, x.dim(), code, shape_id]
    width = 2 * len(fields)
    header = torch.zeros(n * width, dtype=torch.float32)
    header[me * width:(me + 1) * width] = torch.tensor(
        [h for f in fields for h in _split24(f)], dtype=torch.float32
    )
    push_pull_inplace(header, average=False, name=f"{name}.sizes")
    h = header.to(torch.int64).view(n, len(fields), 2)
    got = (h[:, :, 0] | (h[:, :, 1] << 24)).tolist()
    if any(g[3] == 0 for g in got):
        bad = [r for r, g in enumerate(got) if g[3] == 0]
        raise TypeError(
            f"allgather of {name!r}: rank(s) {bad} hand in a tensor of a dtype pushpull does not "
            f"carry (this rank: {x.dtype}); float and integer tensors only"
        )
    if any(g[1:] != got[me][1:] for g in got):
        desc = [f"rank {r}: {g[2]} dims, {g[1]} elements per row, "
                f"{_GATHERABLE[g[3] - 1]}" for r, g in enumerate(got)]
        raise ValueError(
            f"allgather of {name!r}: the tensors differ beyond their first dimension or in dtype "
            f"({'; '.join(desc)}; this rank's shape {tuple(x.shape)})"
        )
    counts = [g[0] for g in got]
    offset, total = sum(counts[:me]), sum(counts)
    # Every other rank's rows are -0.0 (0 for integers): x + (-0.0) is x for every float x,
    # -0.0 included, so the rank-order sum is the concatenation, bit for bit.
    pad = 0 if x.dtype in _INTEGER else -0.0
    out = torch.full((total, *trailing), pad, dtype=x.dtype, device=x.device)
    out[offset:offset + x.shape[0]] = x
    dname = f"{name}.{total * row}"
    r = _Round(dname, out)
    _ensure_declared(dname, r, priority)
    _start_sums([r], False)
    return _register(r)


def allgather(
    tensor: torch.Tensor,
    same_shape=True,
    name: Optional[str] = None,
    version: int = 0,
    priority: int = 0,
    process_set: Optional[ProcessSet] = None,
) -> torch.Tensor:
    """Every worker's ``tensor`` concatenated along dimension 0, in rank order, as a new
    tensor (the input is unchanged); the first dimensions may differ, the rest and the dtype
    must match (else every worker raises, naming each rank's shape). A 0-dim tensor counts as
    one row. BytePS's signature ``(tensor, same_shape=True, name=None, version=0, priority=0)``
    and Horovod's ``(tensor, name=None)`` are both accepted (a string second argument is the
    name); ``same_shape`` is not needed: the first dimensions are always gathered first.

    Exact, built from sums: every worker's rows go in its own slot of a tensor padded with
    -0.0 (0 for integers), summed in one round, so each element is a sum of one value and
    zeros: float32 bit for bit, float16/bfloat16 exactly, float64 rounded to float32 (as every
    pushpull round), integers as in :func:`push_pull` (magnitudes below 2**24). As in every
    sum, a chunk holding inf or NaN comes back NaN. Unlike Horovod's and BytePS's, the result
    carries no autograd graph. The rounds are declared ``NAME.sizes`` and ``NAME.LENGTH``
    (the flat length of the result), so a name may gather tensors of any size.
    ``process_set``: the global set only."""
    return synchronize(allgather_async(tensor, same_shape, name, version, priority, process_set))


def barrier(process_set: Optional[ProcessSet] = None) -> None:
    """Waits until every worker has called :func:`barrier` (Horovod's ``barrier``; the
    scheduler's barrier, no tensor rounds); ``process_set``: the global set only."""
    _check_process_set(process_set, "barrier")
    _w().barrier()


def join(device: int = -1, process_set: Optional[ProcessSet] = None) -> int:
    """Horovod's ``join``, as a barrier: waits until every worker has called ``join`` and
    returns the rank that called it last (by each worker's wall clock at its call, to the
    millisecond; the clocks of different hosts should be synchronized; ties go to the higher
    rank). ``device`` is accepted and unused.

    Unlike Horovod's, a worker waiting in ``join`` does not take part in other workers'
    rounds with zeros: every worker must stop starting rounds (e.g. at the end of its data)
    before calling it, or the others' rounds wait for it forever (until a timeout).
    ``process_set``: the global set only."""
    _check_process_set(process_set, "join")
    n, me = size(), rank()
    now_ms = int(time.time() * 1000)
    stamps = torch.zeros(n * 2, dtype=torch.float32)
    stamps[2 * me:2 * me + 2] = torch.tensor(_split24(now_ms), dtype=torch.float32)
    push_pull_inplace(stamps, average=False, name="join.clock")
    v = stamps.to(torch.int64).view(n, 2)
    ms = (v[:, 0] | (v[:, 1] << 24)).tolist()
    last = max(range(n), key=lambda r: (ms[r], r))
    return last


# --- Horovod's build and timeline queries ----------------------------------------------------
# pushpull exchanges through its own servers over QUIC: none of Horovod's backends is built in.


def mpi_built() -> bool:
    """Horovod's ``mpi_built``: False (pushpull has no MPI backend)."""
    return False


def gloo_built() -> bool:
    """Horovod's ``gloo_built``: False (pushpull's rounds go through its own servers)."""
    return False


def nccl_built() -> bool:
    """Horovod's ``nccl_built``: False (pushpull compresses on the GPU with its own kernels and
    sends over QUIC, not NCCL); scripts that scale the learning rate by ``local_size()`` for
    NCCL's Adasum take their other branch, as ``op=Adasum`` is refused anyway."""
    return False


def ddl_built() -> bool:
    """Horovod's ``ddl_built``: False."""
    return False


def ccl_built() -> bool:
    """Horovod's ``ccl_built``: False."""
    return False


def rocm_built() -> bool:
    """Horovod's ``rocm_built``: False (pushpull's GPU kernels are CUDA's)."""
    return False


def cuda_built() -> bool:
    """Horovod's ``cuda_built``: whether torch has CUDA (pushpull's extension compiles its
    CUDA kernels at run time, through NVRTC, where a GPU is present)."""
    return torch.cuda.is_available()


def mpi_enabled() -> bool:
    """Horovod's ``mpi_enabled``: False."""
    return False


def gloo_enabled() -> bool:
    """Horovod's ``gloo_enabled``: False."""
    return False


def mpi_threads_supported() -> bool:
    """Horovod's ``mpi_threads_supported``: False (there is no MPI)."""
    return False


def start_timeline(file_path: str, mark_cycles: bool = False) -> None:
    """Horovod's ``start_timeline``: refused with ``ValueError``, naming what to use: pushpull's
    timeline is set when a node starts (``trace.dir`` in the cluster file, ``PUSHPULL_TRACE=DIR``
    or BytePS's ``BYTEPS_TRACE_ON=1``; docs/observability.md), one Chrome-trace file per node."""
    raise ValueError(
        f"start_timeline({file_path!r}): pushpull's timeline is set when each node starts, not "
        "while it runs: set trace.dir in the cluster file, PUSHPULL_TRACE=DIR or "
        "BYTEPS_TRACE_ON=1 (see docs/observability.md)")


def stop_timeline() -> None:
    """Horovod's ``stop_timeline``: refused as :func:`start_timeline` is."""
    raise ValueError(
        "stop_timeline(): pushpull's timeline is written when each node ends; it is set when "
        "the node starts (trace.dir, PUSHPULL_TRACE=DIR or BYTEPS_TRACE_ON=1)")
