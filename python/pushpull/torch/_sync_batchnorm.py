"""Horovod's ``SyncBatchNorm``: batch normalisation whose statistics are those of every
worker's batch together (:class:`SyncBatchNorm`)."""

from __future__ import annotations

import itertools
from typing import Optional

import torch
from torch.nn.modules.batchnorm import _BatchNorm

from ._push_pull import push_pull
from ._state import size

# Default names: the k-th SyncBatchNorm made in a process is "SyncBatchNorm.k".
_made = itertools.count()


class SyncBatchNorm(_BatchNorm):
    """Batch normalisation over every worker's batch together, as Horovod's
    ``hvd.SyncBatchNorm`` and torch's ``nn.SyncBatchNorm`` (over every worker: no process
    groups). Arguments as torch's ``BatchNorm*d`` (inputs of 2 or more dimensions, channels
    in dimension 1), plus ``name``: the tensor its statistics travel as (default
    ``SyncBatchNorm.K.stats``, K the order this process made its SyncBatchNorms in, the same
    on every worker when every worker builds the same model).

    In training, each channel's mean and variance are those of all the workers' inputs: one
    round sums each worker's per-channel counts, sums and sums of squares (float32, the
    servers' rank-order sum), and the backward pass sums their gradients through the same
    tensor, so the input's gradient is that of the whole batch's normalisation, as torch's
    and Horovod's are. The running statistics take the global mean and the unbiased global
    variance. In evaluation, or with one worker, it is torch's batch norm. Every worker must
    run the same forward and backward passes."""

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: Optional[float] = 0.1,
                 affine: bool = True, track_running_stats: bool = True,
                 name: Optional[str] = None):
        super().__init__(num_features, eps, momentum, affine, track_running_stats)
        self.name = name if name is not None else f"SyncBatchNorm.{next(_made)}.stats"

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"SyncBatchNorm {self.name!r}: expected an input of 2 or more "
                             f"dimensions (channels in dimension 1), got {input.dim()}")

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(input)
        if not self.training or size() == 1:
            return super().forward(input)
        c = input.shape[1]
        if c != self.num_features:
            raise ValueError(f"SyncBatchNorm {self.name!r}: {c} channels, declared with "
                             f"{self.num_features}")
        dims = [0, *range(2, input.dim())]
        x = input.float()
        local = torch.cat([x.sum(dims), (x * x).sum(dims),
                           x.new_full((1,), float(input.numel() // max(c, 1)))])
        total = push_pull(local, average=False, name=self.name)
        n = total[2 * c]
        mean = total[:c] / n
        var = (total[c:2 * c] / n - mean * mean).clamp_min(0)
        if self.track_running_stats:
            with torch.no_grad():
                self.num_batches_tracked.add_(1)
                m = (1.0 / float(self.num_batches_tracked) if self.momentum is None
                     else self.momentum)
                self.running_mean.mul_(1 - m).add_(mean.detach(), alpha=m)
                unbiased = var.detach() * (n / (n - 1).clamp_min(1))
                self.running_var.mul_(1 - m).add_(unbiased, alpha=m)
        shape = [1, c] + [1] * (input.dim() - 2)
        y = (x - mean.view(shape)) * torch.rsqrt(var.view(shape) + self.eps)
        if self.affine:
            y = y * self.weight.view(shape) + self.bias.view(shape)
        return y.to(input.dtype)
