"""``DistributedDataParallel``: BytePS's module wrapper (``byteps.torch.parallel``) on
pushpull's rounds. Parameters are broadcast from rank 0 when it is built, gradients are
averaged over every worker during the backward pass, and buffers are broadcast from rank 0 at
every forward pass."""

from __future__ import annotations

import contextlib
from typing import Dict, List, Optional

import torch

from ..._native import PushPullError
from .._broadcast import broadcast_parameters
from .._declare import _ensure_declared, declare
from .._push_pull import _start_sums
from .._round import _Round
from ..compression import Compression, _Compressor, check_compression


class DistributedDataParallel(torch.nn.Module):
    """Wraps ``module`` for data-parallel training, as BytePS's
    ``byteps.torch.parallel.DistributedDataParallel(module, device_ids=None,
    broadcast_buffers=True, compression=Compression.none)``:

    * at construction, every parameter that requires grad is declared ``Gradient.NAME``
      (a collective, in ``named_parameters`` order, the i-th with priority ``-i``, with
      ``compression``'s map: ``Compression.none`` or ``Compression.fp16``), and the module's
      ``state_dict()`` is broadcast from rank 0 (:func:`pushpull.torch.broadcast_parameters`);
    * during ``backward()``, a hook push_pulls each gradient (averaged, in place in ``.grad``)
      as soon as it has been accumulated; when the last one has started, the hook waits for
      all of them, so ``.grad`` holds the average once ``backward()`` returns. If some
      parameters get no gradient in a step (branches), call :meth:`synchronize` after
      ``backward()``: it push_pulls the missing ones (zeros where ``.grad`` is None) and
      waits, so that every worker runs the same rounds;
    * with ``broadcast_buffers=True`` (the default), every ``forward`` first broadcasts the
      module's buffers from rank 0;
    * :meth:`no_sync` accumulates gradients locally; the first backward pass outside it
      push_pulls the accumulated gradients.

    ``device_ids``: as in BytePS, a list of exactly one device (``ValueError`` otherwise), or
    ``None`` (BytePS requires it; pushpull also takes CPU modules without it). The module is not
    moved: put it on its device first. Differences from BytePS: the hooks are registered
    whatever ``size()`` is (BytePS only with several workers), and a gradient computed twice
    before its round was waited for raises :class:`pushpull.PushPullError` instead of racing.
    """

    def __init__(
        self,
        module: torch.nn.Module,
        device_ids: Optional[List] = None,
        broadcast_buffers: bool = True,
        compression: _Compressor = Compression.none,
    ):
        super().__init__()
        if device_ids is not None:
            device_ids = list(device_ids)
            if len(device_ids) != 1:
                raise ValueError(
                    f"device_ids = {device_ids!r}: DistributedDataParallel takes exactly one "
                    "device (one process per GPU), or None"
                )
        check_compression(compression)
        self.module = module
        self.device_ids = device_ids
        self.broadcast_buffers = broadcast_buffers
        self._compression = compression
        self._require_backward_grad_sync = True
        self._entries = []  # (tensor name, parameter)
        self._index: Dict[int, int] = {}
        for i, (name, p) in enumerate(module.named_parameters()):
            if not p.requires_grad:
                continue
            tname = f"Gradient.{name}"
            declare(tname, p, compression.params, priority=-i)
            self._index[id(p)] = len(self._entries)
            self._entries.append((tname, p))
        self._inflight: Dict[int, _Round] = {}  # by entry
        if module.state_dict():
            broadcast_parameters(module.state_dict(), root_rank=0)
        self._hooks = [p.register_post_accumulate_grad_hook(self._hook) for _, p in self._entries]

    def forward(self, *inputs, **kwargs):
        if self.broadcast_buffers:
            buffers = list(self.module.named_buffers())
            if buffers:
                with torch.no_grad():
                    broadcast_parameters(buffers, root_rank=0)
        return self.module(*inputs, **kwargs)

    @contextlib.contextmanager
    def no_sync(self):
        """Within this context, backward passes accumulate gradients locally without
        push_pulling them; the first backward pass after it push_pulls the sums."""
        before = self._require_backward_grad_sync
        self._require_backward_grad_sync = False
        try:
            yield
        finally:
            self._require_backward_grad_sync = before

    def _start(self, k: int) -> None:
        tname, p = self._entries[k]
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        r = _Round(tname, p.grad)
        _ensure_declared(tname, r, 0)
        _start_sums([r], average=True)
        self._inflight[k] = r

    def _hook(self, p: torch.Tensor) -> None:
        if not self._require_backward_grad_sync:
            return
        k = self._index[id(p)]
        if k in self._inflight:
            raise PushPullError(
                f"tensor {self._entries[k][0]!r}: gradient computed again while its push_pull "
                "is in flight; call synchronize() after a backward pass that leaves some "
                "parameters without a gradient, or use no_sync() to accumulate"
            )
        self._start(k)
        if len(self._inflight) == len(self._entries):
            self.synchronize()

    def synchronize(self) -> None:
        """Push_pulls every gradient not handed over in this step (zeros where ``.grad`` is
        None) and waits for all of them: ``.grad`` then holds the averages."""
        for k in range(len(self._entries)):
            if k not in self._inflight:
                self._start(k)
        inflight, self._inflight = self._inflight, {}
        for r in inflight.values():
            r.finish()
