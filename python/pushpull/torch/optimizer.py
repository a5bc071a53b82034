"""``DistributedOptimizer`` of :mod:`pushpull.torch` (``Compression`` lives in
``compression.py``): an optimizer whose
``step()`` uses gradients averaged over every worker, reduced in DDP-style buckets (each a group
call: one batch on a GPU) started by hooks as the backward pass produces them.
"""

from __future__ import annotations

import contextlib
import os
import weakref
from typing import Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

import torch

from .._native import PushPullError
from ._declare import ParamMap, _check_sync_args, _with_pieces, _with_rows, declare
from . import _average, _state
from ._push_pull import _start_sums
from ._round import _Round
from ._state import _w, size
from .horovod import _average_of, _check_process_set
from .compression import (Compression, _Compressor, _UserCompressor, check_compression,
                          compressor_of)


_MOMENTUM_KEYS = ("momentum", "byteps_momentum_type")
_EF_KEYS = ("ef", "byteps_ef_type", "byteps_error_feedback_type")


def _value(params: Mapping[str, str], keys) -> Optional[Tuple[str, str]]:
    for k in keys:
        if k in params:
            return k, params[k]
    return None


def _own_momentum(group: Mapping) -> Optional[str]:
    """What makes an optimizer's parameter group carry momentum of its own, if anything."""
    m = group.get("momentum", 0)
    if isinstance(m, (int, float)) and m > 0:
        return f"momentum={m}"
    if "betas" in group:
        return f"betas={tuple(group['betas'])}"
    return None


def _horovod_buckets(params: Sequence[torch.Tensor], groups: Sequence[int],
                     num_groups: int, explicit) -> Optional[List[List[int]]]:
    """Horovod's explicit grouping as buckets of entries ``0..n`` (``params[k]`` is entry k's
    parameter), or None without it: ``num_groups`` G > 0 splits the entries, in order, into G
    runs of equal count (the first ones one longer, Horovod's ``split_list``); ``explicit``
    (Horovod's ``groups``: an int, as ``num_groups``, or lists of parameters) makes each list a
    bucket and every parameter in none a bucket of its own. A bucket is split further where
    the parameter group changes (one learning rate per bucket). Each bucket lists its entries
    in backward order, the last first, as :func:`_buckets` does."""
    if isinstance(explicit, bool) or not (explicit is None or isinstance(explicit, (int, list))):
        raise ValueError(f"groups = {explicit!r}: expected a number of groups or a list of "
                         "lists of parameters (Horovod's groups)")
    if isinstance(num_groups, bool) or not isinstance(num_groups, int) or num_groups < 0:
        raise ValueError(f"num_groups = {num_groups!r}: expected a whole number >= 0")
    if isinstance(explicit, int):
        num_groups, explicit = max(num_groups, explicit), None
    n = len(params)
    if explicit is None and num_groups == 0:
        return None
    if explicit is None:
        g = min(num_groups, n) or 1
        d, r = divmod(n, g)
        runs = [list(range(i * d + min(i, r), (i + 1) * d + min(i + 1, r))) for i in range(g)]
    else:
        index = {id(p): k for k, p in enumerate(params)}
        runs, seen = [], set()
        for i, group in enumerate(explicit):
            run = []
            for p in group:
                k = index.get(id(p))
                if k is None:
                    raise ValueError(f"groups[{i}] holds a tensor that is not a parameter of "
                                     "the optimizer")
                if k in seen:
                    raise ValueError(f"groups[{i}]: a parameter may appear in one group only")
                seen.add(k)
                run.append(k)
            runs.append(sorted(run))
        runs += [[k] for k in range(n) if k not in seen]
    buckets = []
    for run in runs:
        current: List[int] = []
        for k in run:
            if current and groups[k] != groups[current[-1]]:
                buckets.append(current[::-1])
                current = []
            current.append(k)
        if current:
            buckets.append(current[::-1])
    return [b for b in buckets if b]


def _buckets(sizes: Sequence[int], groups: Sequence[int], cap_bytes: int) -> List[List[int]]:
    """Entries ``0..n`` cut into buckets in backward order (the last entry first, as a backward
    pass produces gradients): a bucket closes once it holds ``cap_bytes`` of float32, and at a
    change of parameter group (one learning rate per bucket)."""
    buckets: List[List[int]] = []
    current: List[int] = []
    held = 0
    for k in reversed(range(len(sizes))):
        if current and (held >= cap_bytes or groups[k] != groups[current[-1]]):
            buckets.append(current)
            current, held = [], 0
        current.append(k)
        held += 4 * sizes[k]
    if current:
        buckets.append(current)
    return buckets


def _stream_to_order(device: str) -> Optional[int]:
    """The handle of the stream an ordered step makes wait on ``device`` (0 for
    ``emulated``: the host), or None where it must wait on the CPU instead: the current
    stream is being captured into a CUDA graph (the wait would be replayed with this step's
    ticket), or is the worker's own stream (it would wait for itself), or
    ``CUDA_DEVICE_MAX_CONNECTIONS`` is below its default of 8 (streams then share the GPU's
    hardware queues, and the waiting stream could hold up the worker's, which releases it)."""
    if device == "emulated":
        return 0
    connections = os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS", "").strip()
    if connections.isdigit() and int(connections) < 8:
        return None
    if torch.cuda.is_current_stream_capturing():
        return None
    current = torch.cuda.current_stream(torch.device(device)).cuda_stream
    if current == _w().device_stream(device):
        return None
    return current


# The map of a fused tensor: a plain float32 sum whatever the cluster file's defaults say
# (`Worker::is_plain` confirms it before anything is fused).
_FUSED_MAP = {"compressor": "none", "ef": "none", "momentum": "none", "intra_compressor": "none"}
# What average="momentum"'s warm-up may travel as (DistributedOptimizer's warmup_compression).
_WARMUP_COMPRESSORS = ("none", "fp16", "bf16")


class _Fusion:
    """Gradients of one bucket that travel as one tensor of map ``params``, as in Horovod's
    fusion buffer. Small ones (:data:`_FUSED_MAP`): each is summed as plain float32 (under
    ``cluster.min_compress_bytes``, no state), so packing them into one float32 buffer,
    summing that and unpacking it gives every gradient the bits it would have had alone, in
    one round instead of one per gradient. PowerSGD's (its map with the gradients'
    ``pieces``): each gradient is compressed as its own matrix, as torch's hook does with a
    bucket, in one round of the ``P``s and one of the ``Q``s instead of two per gradient."""

    def __init__(self, name: str, members: List[int], sizes: List[int],
                 params: Mapping[str, str]):
        self.name = name
        self.members = members  # entry indices, in parameter order
        self.sizes = sizes
        self.params = params
        self.numel = sum(sizes)
        self.buffer: Optional[torch.Tensor] = None
        self.grads: Optional[List[torch.Tensor]] = None

    def start(self, grads: List[torch.Tensor]) -> _Round:
        """Packs ``grads`` (on the stream current now) and returns the buffer's round."""
        device = grads[0].device
        if self.buffer is None or self.buffer.device != device:
            self.buffer = torch.empty(self.numel, dtype=torch.float32, device=device)
        torch.cat([g.detach().reshape(-1) for g in grads], out=self.buffer)
        self.grads = grads
        return _Round(self.name, self.buffer)

    def finish(self) -> None:
        """Unpacks the finished round's sum into the gradients (after ``_Round.finish``, so
        on the stream current now, ordered after the result)."""
        grads, self.grads = self.grads, None
        if grads is None:
            return
        pieces = [piece.view(g.shape) for piece, g in zip(self.buffer.split(self.sizes), grads)]
        torch._foreach_copy_([g.detach() for g in grads], pieces)


def _map_of(compression) -> Dict[str, str]:
    """The parameter map of ``compression`` (one of :class:`Compression`'s choices); a
    user-defined compressor class is refused, naming it."""
    c = check_compression(compression)
    if isinstance(c, _UserCompressor):
        raise TypeError(
            f"DistributedOptimizer: compression = {c.name}: a user-defined compressor is run "
            "by push_pull and allreduce; DistributedOptimizer compresses with pushpull's "
            "compressors (Compression.fp16, or compression_params: a parameter map per "
            "gradient, e.g. {'compressor': 'onebit', 'ef': 'vanilla'})"
        )
    return c.params


def _fusions(entries, maps, buckets, fuse_small: bool, warmup) -> List[_Fusion]:
    """The fusions of each bucket, per device, where a bucket has two or more gradients of
    one kind on one device: its float32 gradients of one PowerSGD map (without a warm-up
    tensor of ``average="momentum"``), and (``fuse_small``) its other gradients that would
    travel as plain float32 and are under ``cluster.min_compress_bytes``
    (``Worker::is_plain``, ``Worker::is_small``)."""
    fused = []
    for bucket in buckets:
        groups: Dict[Tuple, List[int]] = {}
        for k in bucket:
            tname, p, _, _ = entries[k]
            n, cmap = p.numel(), maps[k][0]
            if compressor_of(cmap) == "powersgd":
                if p.dtype == torch.float32 and warmup[k] is None:
                    plain = {key: v for key, v in cmap.items() if key != "rows"}
                    groups.setdefault(("powersgd", p.device, tuple(sorted(plain.items()))),
                                      []).append(k)
            elif (fuse_small and p.is_floating_point() and _w().is_small(n)
                  and _w().is_plain(tname, n, cmap)):
                groups.setdefault(("small", p.device), []).append(k)
        for kind, members in groups.items():
            if len(members) < 2:
                continue
            members = sorted(members)
            first, last = (entries[k][0][len("Gradient."):] for k in (members[0], members[-1]))
            sizes = [entries[k][1].numel() for k in members]
            if kind[0] == "powersgd":
                params = _with_pieces(dict(kind[2]), [entries[k][1].shape for k in members])
                fused.append(_Fusion(f"Gradient.powersgd[{first}..{last}]", members, sizes,
                                     params))
                continue
            f = _Fusion(f"Gradient.fused[{first}..{last}]", members, sizes, _FUSED_MAP)
            if _w().is_plain(f.name, f.numel, _FUSED_MAP):
                fused.append(f)
    return fused


def _gradient_name(name: str, p: torch.Tensor) -> str:
    """``Gradient.NAME``, BytePS's name for the gradient of parameter NAME, unless an optimizer
    of this process already gave that name to another parameter (two models whose parameters
    share names, e.g. a GAN's generator and discriminator): then ``Gradient.NAME#2``, ``#3``,
    ..., the first not taken. Names are taken in the order optimizers are made, the same on
    every worker. The same parameter wrapped again keeps its name, and with it its tensor's
    compressor state; a name whose parameter is gone stays taken. The optimizer takes its
    names once it is built (a refused one takes none)."""
    tname, k = f"Gradient.{name}", 1
    while (owner := _state.gradient_params.get(tname)) is not None and owner() is not p:
        k += 1
        tname = f"Gradient.{name}#{k}"
    return tname


class _DistributedOptimizer(torch.optim.Optimizer):
    def __init__(
        self,
        params,
        named_parameters,
        compression,
        backward_passes_per_step,
        compression_params,
        bucket_cap_mb,
        fuse_small,
        ordered_step,
        average,
        warmup_steps,
        warmup_compression,
        op,
        gradient_predivide_factor,
        num_groups,
        groups,
    ):
        super(self.__class__, self).__init__(params)
        if named_parameters is not None:
            named = list(named_parameters)
        else:
            named = [
                (f"param.{g}.{i}", p)
                for g, group in enumerate(self.param_groups)
                for i, p in enumerate(group["params"])
            ]
        names = [n for n, _ in named]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ValueError(f"named_parameters has duplicate names: {sorted(dup)}")
        in_groups = {id(p) for group in self.param_groups for p in group["params"]}
        named_ids = {id(p) for _, p in named}
        if in_groups - named_ids:
            raise ValueError(
                "named_parameters does not name every parameter of the optimizer: pass "
                "model.named_parameters() for the model whose parameters the optimizer holds"
            )
        group_of = {id(p): group for group in self.param_groups for p in group["params"]}
        if backward_passes_per_step < 1:
            raise ValueError(f"backward_passes_per_step = {backward_passes_per_step}: must be >= 1")
        self.backward_passes_per_step = backward_passes_per_step
        self._entries = []  # (tensor name, parameter, group, corrected ef)
        self._index = {}
        maps = []  # (parameter map, priority) of each entry
        for i, (name, p) in enumerate(named):
            if not p.requires_grad or id(p) not in in_groups:
                continue
            if callable(compression_params):
                cmap = compression_params(name)
            elif compression_params is not None:
                cmap = compression_params
            else:
                cmap = _map_of(compression)
            cmap = _with_rows(cmap or {}, p.shape)
            tname = _gradient_name(name, p)
            group = group_of[id(p)]
            mom = _value(cmap, _MOMENTUM_KEYS)
            if mom and mom[1] == "nesterov":
                own = _own_momentum(group)
                if own:
                    raise ValueError(
                        f"tensor {tname!r}: {mom[0]} = 'nesterov' adds momentum on the worker, but "
                        f"the optimizer {type(self).__name__} has its own ({own}); use one of them"
                    )
            ef = _value(cmap, _EF_KEYS)
            corrected = bool(ef and ef[1] == "corrected")
            self._index[id(p)] = len(self._entries)
            self._entries.append((tname, p, group, corrected))
            maps.append((cmap, -i))
        if not bucket_cap_mb > 0:
            raise ValueError(f"bucket_cap_mb = {bucket_cap_mb}: must be > 0")
        effective = [_w().effective_params(tname, p.numel(), maps[k][0])
                     for k, (tname, p, _, _) in enumerate(self._entries)]
        self._average = _average.resolve(average, self, [e[0] for e in self._entries], effective)
        # Horovod's op and gradient_predivide_factor: the gradients summed, or averaged as
        # (g / f) summed, times f / size().
        self._sum = not _average_of(op, None, "DistributedOptimizer")
        f = gradient_predivide_factor
        if isinstance(f, bool) or not isinstance(f, (int, float)) or not 0 < f < float("inf"):
            raise ValueError(f"gradient_predivide_factor = {f!r}: expected a finite number > 0")
        if f != 1.0 and self._sum:
            raise ValueError(f"gradient_predivide_factor = {f!r} with op=Sum: it splits an "
                             "average (as Horovod's, it needs op=Average)")
        if (self._sum or f != 1.0) and self._average != "gradients":
            raise ValueError(f"op=Sum or gradient_predivide_factor with average="
                             f"{self._average!r}: they apply to averaged gradients only "
                             "(average='gradients')")
        self._predivide = float(f)
        if not isinstance(warmup_steps, int) or isinstance(warmup_steps, bool) or warmup_steps < 1:
            raise ValueError(f"warmup_steps = {warmup_steps!r}: must be an int >= 1")
        self._warmup_steps = warmup_steps
        if warmup_compression not in _WARMUP_COMPRESSORS:
            raise ValueError(f"warmup_compression = {warmup_compression!r}: one of "
                             f"{', '.join(map(repr, _WARMUP_COMPRESSORS))}")
        if warmup_compression != "none" and average in ("gradients", "updates"):
            raise ValueError(f"warmup_compression = {warmup_compression!r} with "
                             f"average={average!r}: nothing warms up (only "
                             "average='momentum', or 'auto' where it takes it, does)")
        warmup_map = dict(_FUSED_MAP, compressor=warmup_compression)
        # average="momentum": the uncompressed tensor each compressed gradient travels as in
        # the warm-up (by entry; None for a plain one), and the frozen second moments, taken at
        # the first step after it.
        self._warmup_name: List[Optional[str]] = [
            None if self._average != "momentum" or m is None or
            _w().is_plain(tname, p.numel(), maps[k][0]) else f"{tname}@warmup"
            for k, ((tname, p, _, _), m) in enumerate(zip(self._entries, effective))
        ]
        self._v_hat: Optional[List[torch.Tensor]] = None
        # The parameters before the wrapped optimizer's step (average="updates"), made at the
        # first step.
        self._before: Optional[List[torch.Tensor]] = None
        group_ids = [id(group) for _, _, group, _ in self._entries]
        self._buckets = _horovod_buckets(
            [p for _, p, _, _ in self._entries], group_ids, num_groups, groups
        ) or _buckets(
            [p.numel() for _, p, _, _ in self._entries], group_ids, int(bucket_cap_mb * 2**20)
        )
        self._bucket_of = [0] * len(self._entries)
        for b, bucket in enumerate(self._buckets):
            for k in bucket:
                self._bucket_of[k] = b
        self._fused = _fusions(self._entries, maps, self._buckets, fuse_small,
                               self._warmup_name)
        self._fusion_of = {k: f for f in self._fused for k in f.members}
        # Declared in parameter order (a collective: the same order on every worker), a fused
        # tensor where its first member would be.
        for k, (tname, p, _, _) in enumerate(self._entries):
            f = self._fusion_of.get(k)
            if f is None:
                declare(tname, p, maps[k][0], priority=maps[k][1])
            elif k == f.members[0]:
                declare(f.name, f.numel, f.params, priority=maps[k][1])
            if self._warmup_name[k] is not None:
                declare(self._warmup_name[k], p, warmup_map, priority=maps[k][1])
        for tname, p, _, _ in self._entries:
            _state.gradient_params.setdefault(tname, weakref.ref(p))
        self._passes = [0] * len(self._entries)
        self._ready = [False] * len(self._entries)
        self._waiting = [len(b) for b in self._buckets]  # entries not ready yet, per bucket
        self._inflight: Dict[int, List[_Round]] = {}  # by bucket
        self._synchronized = False
        self._should_synchronize = True
        self._ordered_step = bool(ordered_step)
        # The native handles of the last ordered step's rounds, until their outcomes are
        # collected (_collect); each round keeps its gradient until it has ended.
        self._deferred: Optional[List] = None
        self._names = [f.name for f in self._fused] + [
            tname for k, (tname, _, _, _) in enumerate(self._entries) if k not in self._fusion_of
        ] + [n for n in self._warmup_name if n is not None]
        self._non_finite = _w().rounds_non_finite(self._names)
        self._hooks = [
            p.register_post_accumulate_grad_hook(self._hook) for _, p, _, _ in self._entries
        ]

    def _start(self, b: int) -> None:
        """Starts bucket ``b``'s gradients together (one batch on a GPU)."""
        self._collect()
        rounds = []
        fusions = set()
        for k in self._buckets[b]:
            tname, p, group, corrected = self._entries[k]
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            f = self._fusion_of.get(k)
            if f is not None:
                fusions.add(f)
                continue
            if corrected:
                _w().set_learning_rate(float(group["lr"]))
            if self._warmup_name[k] is not None and self._warming():
                tname = self._warmup_name[k]
            if self._predivide != 1.0:
                with torch.no_grad():
                    p.grad.mul_(1.0 / self._predivide)
            rounds.append(_Round(tname, p.grad))
        for f in sorted(fusions, key=lambda f: f.name):
            rounds.append(f.start([self._entries[k][1].grad for k in f.members]))
        if self._predivide != 1.0:
            for r in rounds:
                r.scale = self._predivide / size()
        _start_sums(rounds, average=not self._sum and self._predivide == 1.0)
        self._inflight[b] = rounds

    def _hook(self, p: torch.Tensor) -> None:
        k = self._index[id(p)]
        self._passes[k] += 1
        if self._passes[k] < self.backward_passes_per_step:
            return
        if self._ready[k]:
            raise PushPullError(
                f"tensor {self._entries[k][0]!r}: gradient computed again before step(); call "
                "step() (or synchronize()) after each backward pass, or set backward_passes_per_step"
            )
        self._ready[k] = True
        if self._at_step():
            return  # the updates or the momentum go at step()
        b = self._bucket_of[k]
        self._waiting[b] -= 1
        if self._waiting[b] == 0:
            self._start(b)

    def _warming(self) -> bool:
        """average="momentum": whether the optimizer has taken fewer than ``warmup_steps``
        steps (its own count, so a restored state carries it)."""
        if self._average != "momentum":
            return False
        taken = next((int(st["step"]) for st in (self.state.get(p) for _, p, _, _ in self._entries)
                      if st and "step" in st), 0)
        return taken < self._warmup_steps

    def _at_step(self) -> bool:
        """Whether this step's rounds start at ``step()``, not as the gradients are ready:
        the updates, or the momentum after the warm-up."""
        return self._average == "updates" or (self._average == "momentum" and not self._warming())

    def _start_rest(self) -> None:
        """Starts the buckets whose gradients are not all ready, gradients that no backward
        pass produced this step as zeros, so every worker runs the same rounds."""
        for b in range(len(self._buckets)):
            if b not in self._inflight:
                self._start(b)

    def _step_done(self) -> None:
        self._passes = [0] * len(self._entries)
        self._ready = [False] * len(self._entries)
        self._waiting = [len(b) for b in self._buckets]

    def _discard_non_finite(self) -> None:
        """A chunk that was not finite on some worker came back as NaN on every worker: a
        loss scaler skips this step everywhere, so its rounds are discarded everywhere."""
        non_finite = _w().rounds_non_finite(self._names)
        if non_finite != self._non_finite:
            self._non_finite = non_finite
            _w().discard_last_round(self._names)

    def synchronize(self) -> None:
        """Waits for every gradient's push_pull; buckets whose gradients are not all ready
        start now, gradients that no backward pass produced this step as zeros, so every
        worker runs the same rounds. With ``average="updates"`` (or ``"momentum"`` after its
        warm-up) the gradients stay this worker's own and there is nothing to wait for."""
        if self._at_step():
            self._synchronized = True
            return
        self._collect()
        self._finish_all()
        self._discard_non_finite()
        self._synchronized = True

    def _finish_all(self) -> None:
        """Starts the buckets not started yet (:meth:`_start_rest`) and waits for every
        round of the step, unpacking the fused tensors; the step's bookkeeping starts over
        even if a round failed."""
        self._start_rest()
        inflight, self._inflight = self._inflight, {}
        try:
            for rounds in inflight.values():
                for r in rounds:
                    r.finish()
            for f in self._fused:
                f.finish()
        finally:
            self._step_done()

    def _synchronize_ordered(self) -> bool:
        """:meth:`synchronize` without the host waiting (``ordered_step``): later work on
        each GPU's current stream waits, on the GPU, for the rounds' results
        (``Worker.order_after``); their outcomes are collected when the next step starts its
        first bucket (:meth:`_collect`). Returns False, having ordered nothing, when a round is
        not on a device or the device cannot order streams: then :meth:`synchronize` waits."""
        self._collect()
        self._start_rest()
        rounds = [r for rs in self._inflight.values() for r in rs]
        by_device: Dict[str, List[_Round]] = {}
        for r in rounds:
            if r.device is None:
                return False
            by_device.setdefault(r.device, []).append(r)
        streams = {d: _stream_to_order(d) for d in by_device}
        if any(s is None for s in streams.values()):
            return False
        for device, rs in by_device.items():
            try:
                _w().order_after([r.native for r in rs], device, streams[device])
            except PushPullError:
                return False  # synchronize() waits for every round, ordered or not
        self._inflight = {}
        # Only the handles: each native round keeps its buffer until it has ended.
        self._deferred = [r.native for r in rounds]
        _state.deferred.add(self)
        for r in rounds:
            r.complete()
        for f in self._fused:
            f.finish()
        self._step_done()
        self._synchronized = True
        return True

    def _collect(self) -> None:
        """The outcomes of the last ordered step's rounds, before anything starts again:
        raises the first error (the step that followed that round ran on what its gradient
        held), then discards the rounds of a non-finite step as :meth:`synchronize` does."""
        natives, self._deferred = self._deferred, None
        if natives is None:
            return
        _state.deferred.discard(self)
        _state.raise_first([native.wait for native in natives])
        self._discard_non_finite()

    def set_backward_passes_per_step(self, passes: int) -> None:
        """BytePS's setter: from now on a gradient is push_pulled after ``passes`` backward
        passes (``>= 1``; ``ValueError`` naming the argument otherwise). Passes counted so far
        for gradients not yet handed over start again from zero, as in BytePS."""
        if not isinstance(passes, int) or isinstance(passes, bool) or passes < 1:
            raise ValueError(f"set_backward_passes_per_step: passes = {passes!r}: must be an int >= 1")
        self.backward_passes_per_step = passes
        for k in range(len(self._entries)):
            if not self._ready[k]:
                self._passes[k] = 0

    @contextlib.contextmanager
    def skip_synchronize(self):
        """Within this context, ``step()`` does not call :meth:`synchronize` (call it yourself
        first, e.g. to clip the averaged gradients)."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def _step_updates(self, closure):
        """``average="updates"``: the wrapped optimizer steps on this worker's gradients, each
        parameter's change is push_pulled (averaged, in the buckets, in ``.grad``) and added to
        the parameter as it was before the step, the same on every worker. A step whose
        average holds inf or NaN (some worker's did) leaves the parameters as they were, on
        every worker."""
        params = [p for _, p, _, _ in self._entries]
        with torch.no_grad():
            if self._before is None:
                self._before = [p.detach().clone() for p in params]
            else:
                torch._foreach_copy_(self._before, [p.detach() for p in params])
        loss = super(self.__class__, self).step(closure)
        with torch.no_grad():
            _average.delta_of(params, self._before)
            self._exchange_then(lambda: torch._foreach_add_(params, [p.grad for p in params]))
        return loss

    def _step_momentum(self, closure):
        """``average="momentum"`` after the warm-up: each worker's first moment from its own
        gradients (``_average.local_momentum``) is push_pulled (averaged, in the buckets, in
        ``.grad``) and Adam's step is taken from it with the second moments frozen at the end
        of the warm-up (``_average.frozen_step``), the same on every worker. A step whose
        average holds inf or NaN leaves the parameters and the state as they were, on every
        worker."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        params = [p for _, p, _, _ in self._entries]
        with torch.no_grad():
            if self._v_hat is None:
                for tname, p, _, _ in self._entries:
                    if "exp_avg_sq" not in self.state.get(p, {}):
                        raise PushPullError(
                            f"tensor {tname!r}: no Adam state after the {self._warmup_steps} "
                            "warm-up steps of average='momentum' (its parameter had no "
                            "gradient in them), so it has no second moment to freeze: raise "
                            "warmup_steps")
                self._v_hat = _average.freeze(self, params)
            _average.local_momentum(self, params)
            self._exchange_then(lambda: _average.frozen_step(self, params, self._v_hat))
        return loss

    def _exchange_then(self, apply: Callable[[], None]) -> None:
        """Push_pulls what ``.grad`` holds (every bucket, at ``step()``) and calls ``apply``,
        unless the average holds inf or NaN (some worker's did): then the step's rounds are
        discarded and nothing is applied, on every worker."""
        self._finish_all()
        non_finite = self._non_finite
        self._discard_non_finite()
        if self._non_finite == non_finite:
            apply()
        self._synchronized = False

    def load_state_dict(self, state_dict):
        """The wrapped optimizer's ``load_state_dict``; with ``average="momentum"`` the frozen
        second moments are taken again from the loaded state."""
        super(self.__class__, self).load_state_dict(state_dict)
        self._v_hat = None

    def step(self, closure=None):
        if self._average == "updates":
            return self._step_updates(closure)
        if self._at_step():
            return self._step_momentum(closure)
        if self._should_synchronize:
            if not (self._ordered_step and self._synchronize_ordered()):
                self.synchronize()
        self._synchronized = False
        return super(self.__class__, self).step(closure)


def DistributedOptimizer(
    optimizer: torch.optim.Optimizer,
    named_parameters: Optional[Iterable[Tuple[str, torch.Tensor]]] = None,
    compression: _Compressor = Compression.none,
    backward_passes_per_step: int = 1,
    staleness: int = 0,
    compression_params: Union[None, ParamMap, Callable[[str], ParamMap]] = None,
    bucket_cap_mb: float = 25,
    fuse_small: bool = True,
    ordered_step: bool = False,
    average: str = "auto",
    warmup_steps: int = 100,
    warmup_compression: str = "none",
    op: Optional[int] = None,
    gradient_predivide_factor: float = 1.0,
    num_groups: int = 0,
    groups=None,
    sparse_as_dense: bool = False,
    process_set=None,
) -> torch.optim.Optimizer:
    """Wraps ``optimizer`` so that ``step()`` uses gradients averaged over every worker.

    Every parameter is declared up front (a collective), in ``named_parameters`` order, as
    ``Gradient.NAME`` with priority ``-i`` for the i-th, so earlier layers' gradients go first
    (small ones within a fused tensor, see ``fuse_small``). A name that an earlier optimizer
    of this process gave to another parameter (a second model with the same parameter names)
    becomes ``Gradient.NAME#2`` (``#3``, ...), so that the two never share a tensor or its
    compressor state; the same parameter wrapped again keeps its name and state.
    The gradients are reduced in buckets, as DDP's: the parameters in reverse order (the order
    a backward pass produces their gradients), a bucket closing at ``bucket_cap_mb`` MiB of
    float32 (DDP's default, 25) and at a change of parameter group. A hook marks each gradient
    ready once the backward pass has accumulated it (after ``backward_passes_per_step``
    passes), and a bucket's gradients are push_pulled together (one group call: one batch on a
    GPU) as soon as all of them are ready, overlapping communication with the rest of the
    backward pass; ``step()`` starts what is left, waits for all of them and then runs the
    wrapped optimizer's step. The result is an instance of a subclass of the optimizer's
    class, made from its ``param_groups``.

    With ``fuse_small`` (the default), a bucket's gradients that travel as plain float32
    because they are under ``cluster.min_compress_bytes`` (biases, normalisation weights; not
    those with momentum, error feedback or intra-host rounding left) go as one tensor,
    ``Gradient.fused[FIRST..LAST]`` (its first and last parameter names), as Horovod's fusion
    buffer does: one round instead of one per gradient, the same bits (each element is summed
    on its own). It is packed on the stream current at the bucket's hook and unpacked at
    ``synchronize()``. ``metrics()`` then lists the fused tensor, not its members; with
    ``fuse_small=False`` every gradient is its own tensor. A fused chunk holding inf or NaN on
    some worker comes back as NaN for all its members (the step is skipped either way, see
    "Mixed precision" in :mod:`pushpull.torch`). A checkpoint (:func:`save_state`) holds the
    tensors as declared, so a job restarted from it needs the same ``fuse_small``.

    A bucket's float32 gradients of one PowerSGD map (``{"compressor": "powersgd", ...}``) go
    as one tensor too, ``Gradient.powersgd[FIRST..LAST]``, declared with their shapes
    (``pieces``): each gradient is still compressed as its own matrix (torch's hook's
    ``view(shape[0], -1)``), but a step takes one round of the bucket's ``P``s and one of its
    ``Q``s, as torch's hook takes one all-reduce of each per bucket, where a tensor per
    gradient would take two rounds each (``fuse_small`` does not change this; a smaller
    ``bucket_cap_mb`` makes more, smaller buckets). Its compressor state (the error, the
    warm-start ``Q``) is the fused tensor's, so a restart from a checkpoint needs the same
    buckets.

    ``compression_params`` gives each gradient pushpull's per-tensor compression: one string
    map for every tensor, or a function of the parameter name returning its map (keys as in
    the Rust API: ``byteps_compressor_type``, ``byteps_compressor_k``, ``byteps_ef_type``,
    ``byteps_momentum_type``, ...). When given, it replaces ``compression``. A map with
    ``momentum = nesterov`` is refused (``ValueError``) for an optimizer that has momentum of its
    own; with ``ef = corrected`` the learning rate of the parameter's group is read from
    ``param_groups`` at every step.

    ``average`` says what is averaged. ``"gradients"``: the gradients, and the wrapped
    optimizer steps on their average, as under DDP. ``"updates"``: each worker steps its own
    copy of the wrapped optimizer (its own momentum or moments) on its own gradients, then
    each parameter's change is averaged over the workers (in ``.grad``: ``Gradient.NAME``
    carries the change, compressed by its map, in the same buckets, all at ``step()``, so
    nothing overlaps the backward pass) and added to the parameter as it was before the
    step, the same on every worker. Uncompressed, the two are the same for SGD with or
    without momentum (a step is linear in the gradients) and close for Adam. ``"momentum"``
    (``torch.optim.Adam`` and ``AdamW`` only, DeepSpeed's 1-bit Adam): the first
    ``warmup_steps`` steps average the gradients uncompressed (each compressed tensor
    travels as ``Gradient.NAME@warmup``, declared beside it, as float32 or, with
    ``warmup_compression`` ``"fp16"`` or ``"bf16"``, in half the bytes: refused with
    ``average="gradients"`` or ``"updates"``, where nothing warms up, and used by ``"auto"``
    where it takes ``"momentum"``); after them each
    parameter's second moment is frozen as the warm-up left it, each worker's first moment
    (the averaged one carried over, plus its own gradient) is averaged through the tensor's
    map, at ``step()``, and becomes every worker's, and Adam's step is taken from it, the same
    on every worker; the optimizer's state keeps Adam's layout (``exp_avg_sq`` is the frozen
    moment times the bias correction), so a checkpoint of it restarts frozen. Freeze after
    the learning rate's warm-up and about a fifth of training (DeepSpeed warms 1-bit Adam up
    for 15-25 %): on bench/tta's transformer with 4 workers and 360 steps, onebit frozen after
    72 steps (warmed up as fp16) ended 1.02 % above uncompressed AdamW over three seeds
    (BENCHMARKS.md "Final quality of every preset, both workloads").

    Compressed, the optimizer's state never sees the compression error in the last two,
    which is what onebit and top-k with error feedback need under an optimizer with state. On
    a transformer with AdamW (BENCHMARKS.md "Onebit with the user's AdamW, through the
    cluster"), onebit's gradients end at 4.505 validation bits per byte, its updates at
    3.248 and its momentum at 3.077 (top-k 1 %: 4.350, 3.418, 3.321), against 3.104
    uncompressed. ``"auto"`` (the default) takes ``"momentum"`` where a tensor's compressor
    is onebit or top-k with error feedback and the optimizer is Adam or AdamW, ``"updates"`` where it is another optimizer with state
    (anything but ``torch.optim.SGD`` without momentum), saying so once on stderr, and the
    gradients otherwise; ``"gradients"`` is refused there (``ValueError`` naming the
    optimizer and the tensor), as is ``"momentum"`` for an optimizer it cannot run.

    With the updates or the momentum averaged (after the warm-up), :meth:`synchronize` has
    nothing to wait for (clipping clips this worker's gradients), ``ef = corrected`` is
    refused, and a step whose average holds inf or NaN leaves the parameters as they were on
    every worker (with the updates, the state of a worker whose gradients overflowed keeps
    what its step made of them). With the updates, the optimizer's state differs between
    workers (a script that saves only rank 0's restarts every worker from rank 0's). Neither
    goes with a loss scaler (``torch.amp.GradScaler``): a worker whose gradients overflow
    skips ``optimizer.step()``, and with it the step's rounds, which the other workers wait
    for. A torch DDP communication hook can do neither: it never sees the optimizer.

    ``op`` and ``gradient_predivide_factor`` are Horovod's: ``op=Sum`` sums the gradients
    instead of averaging them (``Average``, the default; ``Adasum`` raises ``ValueError``);
    ``gradient_predivide_factor`` f divides each gradient by f before the sum and multiplies
    the sum by f / ``size()`` (an average split in two, with ``op=Average`` only). Both apply
    to averaged gradients: ``average="updates"`` and ``"momentum"`` refuse them.

    ``num_groups`` and ``groups`` are Horovod's explicit grouping, and replace the buckets of
    ``bucket_cap_mb``: ``num_groups`` G splits the parameters, in ``named_parameters`` order,
    into G buckets of equal count; ``groups`` (lists of parameters, or a number as
    ``num_groups``) makes each list a bucket and every other parameter a bucket of its own.
    Each bucket's gradients are push_pulled together once all are ready, as Horovod's grouped
    allreduce; a bucket is split where the parameter group changes. ``sparse_as_dense`` is
    accepted (gradients are dense) and ``process_set`` is the global set only.

    ``staleness`` is BytePS's argument, in BytePS's place: pushpull's rounds are synchronous,
    so anything but 0 raises ``ValueError`` before a parameter is declared.

    ``set_backward_passes_per_step(passes)`` (BytePS's method) changes
    ``backward_passes_per_step`` later, e.g. when the accumulation schedule changes.

    With ``ordered_step`` and every gradient on a GPU, ``step()`` does not wait on the CPU
    for the results: the wrapped optimizer's kernels, and everything launched after them
    (``zero_grad``, the next forward pass), are queued at once, and the GPU runs them once the
    worker's stream has written the averaged gradients (the current stream waits on a word
    that stream writes, ``cuStreamWaitValue32``), as DDP's asynchronous all-reduce lets a step
    be queued. The CPU learns the rounds' outcomes when the next step starts its first bucket
    (or at :meth:`synchronize`, ``save_state``, ``shutdown``, or the next round of another
    CUDA tensor, which must not queue the worker's stream behind the waiting one): a failed
    round raises there, and the step after it has then run on what its gradient held (the job
    is usually over: a lost node). Each round keeps its gradient until it has ended, so
    ``zero_grad()`` may drop them meanwhile. A step with a gradient on the host, or a device that cannot
    order streams, or where the worker's stream might not run beside the waiting one
    (``CUDA_DEVICE_MAX_CONNECTIONS`` below 8, CUDA graph capture, the worker's stream current)
    waits as without ``ordered_step``. On the emulated route
    (``PUSHPULL_TORCH_ROUTE=emulated``) the host is the stream, so ``step()`` waits there, and
    only the outcomes are collected later. Off by default until it is measured on a GPU.

    With mixed precision (``torch.amp.GradScaler``), call :meth:`synchronize` before the
    scaler's ``step`` (see "Mixed precision" in :mod:`pushpull.torch`): a step whose averaged
    gradients hold NaN (some worker's overflowed) has its rounds discarded on every worker.
    """
    _check_sync_args(0, staleness)
    _check_process_set(process_set, "DistributedOptimizer")
    if not isinstance(sparse_as_dense, bool):
        raise ValueError(f"sparse_as_dense = {sparse_as_dense!r}: expected True or False")
    cls = type(
        optimizer.__class__.__name__,
        (optimizer.__class__,),
        dict(_DistributedOptimizer.__dict__),
    )
    return cls(
        optimizer.param_groups,
        named_parameters,
        compression,
        backward_passes_per_step,
        compression_params,
        bucket_cap_mb,
        fuse_small,
        ordered_step,
        average,
        warmup_steps,
        warmup_compression,
        op,
        gradient_predivide_factor,
        num_groups,
        groups,
    )
