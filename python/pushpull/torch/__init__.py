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
    (:func:`allreduce` and its forms with ``op=Average`` / ``Sum``, and ``Min`` / ``Max`` /
    ``Product`` reduced from an allgather, :func:`allgather`,
    :func:`broadcast_`, :func:`broadcast_object`, :func:`join`, :func:`barrier`). Where
    pushpull cannot do what they do, the call says so instead of ignoring an argument:
    ``version`` and ``staleness`` other than 0 raise ``ValueError`` (rounds are synchronous),
    :func:`resume` with other sizes raises ``ValueError`` (no elastic resizing), ``op=Adasum``
    raises ``ValueError``; :func:`join` is a barrier (a joined worker does not stand in for
    others' rounds with zeros). Each function's docstring names its differences.

torch's DistributedDataParallel
    ``model.register_comm_hook(PushPullHookState(params=MAP), push_pull_hook)`` sends DDP's
    gradient buckets through pushpull's rounds, each bucket a tensor with its own compressor
    state (see :func:`push_pull_hook`); DDP keeps its own process group for its setup.

Checkpoint and restart
    :func:`save_state` (every worker, between steps, its own file) saves what the compressors
    carry: error-feedback residuals, momentum, each tensor's round, the learning rate, and in
    rank 0's file the servers' state; :func:`load_state` in a fresh job with the same settings
    (``cluster.seed`` set to the saved seed), after the tensors are declared and before the
    first step, continues bit for bit. Save the model and optimizer as usual beside it.

Failures
    Errors raise :class:`pushpull.PushPullError` (naming the tensor and the key or value);
    when a node is lost every waiting and later call raises :class:`pushpull.NodeLostError`
    naming it, instead of hanging.

Modules
    ``_state``        the worker and every piece of module-level state (read as
                      ``_state.NAME``), init / shutdown, rank and sizes, metrics,
                      suspend / resume; it imports none of the modules below
    ``_declare``      declare, and the declaration checks of a round's tensor
    ``_round``        one round in flight: dtypes, integer tensors, CUDA stream ordering
    ``_push_pull``    push_pull's forms, poll, synchronize, discard_last_round
    ``_checkpoint``   save_state, load_state: the compressors' state across a restart
    ``_broadcast``    broadcast, broadcast_parameters / optimizer_state / object
    ``compression``   ``Compression``: BytePS's compression choices as parameter maps
    ``optimizer``     ``DistributedOptimizer``
    ``_gossip``       ``DecentralizedOptimizer``: decentralised SGD (Moniqua, D-PSGD)
    ``horovod``       Horovod's spellings: allreduce, allgather, join, barrier
    ``_sync_batchnorm`` ``SyncBatchNorm``: batch norm over every worker's batch (Horovod's)
    ``parallel``      ``DistributedDataParallel``
    ``ddp_comm_hook`` ``push_pull_hook`` and ``PushPullHookState``: torch's own
                      ``DistributedDataParallel`` with pushpull's rounds and compression
"""

from __future__ import annotations

from .._native import NodeLostError, PushPullError
from ._broadcast import (
    broadcast,
    broadcast_,
    broadcast_async,
    broadcast_async_,
    broadcast_object,
    broadcast_optimizer_state,
    broadcast_parameters,
)
from ._checkpoint import load_state, save_state
from ._declare import ParamMap, _check_sync_args, _ensure_declared, declare
from ._push_pull import (
    _new_name,
    _register,
    _start_sums,
    discard_last_round,
    poll,
    push_pull,
    push_pull_async,
    push_pull_async_inplace,
    push_pull_group_async_inplace,
    push_pull_group_inplace,
    push_pull_inplace,
    synchronize,
)
from ._round import _CONVERTIBLE, _INTEGER, _Round
from ._state import (
    _w,
    cross_rank,
    cross_size,
    init,
    is_initialized,
    local_rank,
    local_size,
    metrics,
    rank,
    resume,
    shutdown,
    size,
    suspend,
)
# The rounds in flight by handle (tests read it): the one dict, cleared at shutdown and never
# rebound. The state that init() and shutdown() rebind is read through _state only.
from ._state import handles as _handles
from .compression import Compression, _Compressor
from ._gossip import DecentralizedOptimizer
from .ddp_comm_hook import PushPullHookState, push_pull_hook
from .horovod import (
    Adasum,
    Average,
    HorovodInternalError,
    HostsUpdatedInterrupt,
    Max,
    Min,
    ProcessSet,
    Product,
    Sum,
    allgather,
    allgather_async,
    allgather_object,
    allreduce,
    allreduce_,
    allreduce_async,
    allreduce_async_,
    barrier,
    ccl_built,
    cuda_built,
    ddl_built,
    global_process_set,
    gloo_built,
    gloo_enabled,
    grouped_allreduce,
    grouped_allreduce_,
    join,
    mpi_built,
    mpi_enabled,
    mpi_threads_supported,
    nccl_built,
    rocm_built,
    start_timeline,
    stop_timeline,
)
from .optimizer import DistributedOptimizer, _buckets
from ._sync_batchnorm import SyncBatchNorm
from . import parallel

__all__ = [
    "Adasum",
    "Average",
    "Compression",
    "DecentralizedOptimizer",
    "DistributedOptimizer",
    "HorovodInternalError",
    "HostsUpdatedInterrupt",
    "Max",
    "Min",
    "NodeLostError",
    "ProcessSet",
    "Product",
    "PushPullError",
    "PushPullHookState",
    "Sum",
    "SyncBatchNorm",
    "allgather",
    "allgather_async",
    "allgather_object",
    "allreduce",
    "allreduce_",
    "allreduce_async",
    "allreduce_async_",
    "barrier",
    "broadcast",
    "broadcast_",
    "broadcast_async",
    "broadcast_async_",
    "broadcast_object",
    "broadcast_optimizer_state",
    "broadcast_parameters",
    "ccl_built",
    "cross_rank",
    "cross_size",
    "cuda_built",
    "ddl_built",
    "declare",
    "discard_last_round",
    "global_process_set",
    "gloo_built",
    "gloo_enabled",
    "grouped_allreduce",
    "grouped_allreduce_",
    "init",
    "is_initialized",
    "join",
    "load_state",
    "local_rank",
    "local_size",
    "metrics",
    "mpi_built",
    "mpi_enabled",
    "mpi_threads_supported",
    "nccl_built",
    "poll",
    "push_pull",
    "push_pull_async",
    "push_pull_async_inplace",
    "push_pull_group_async_inplace",
    "push_pull_group_inplace",
    "push_pull_hook",
    "push_pull_inplace",
    "rank",
    "resume",
    "rocm_built",
    "save_state",
    "shutdown",
    "size",
    "start_timeline",
    "stop_timeline",
    "suspend",
    "synchronize",
]
