"""Decentralised SGD (Moniqua's Algorithm 1 and full-precision D-PSGD):
:class:`DecentralizedOptimizer` wraps a torch optimizer so that each step averages this
worker's parameters with its graph neighbours' before the optimizer applies the gradient."""

from __future__ import annotations

from typing import Dict, Iterable, List, Mapping, Optional, Tuple

import torch

from ._broadcast import broadcast_parameters
from ._declare import declare
from ._push_pull import push_pull_group_inplace
from ._round import _CONVERTIBLE, _Round
from ._state import _check_running, _w


class DecentralizedOptimizer:
    """Decentralised SGD around ``optimizer``: every worker keeps its own model, and
    :meth:`step` does Moniqua's Algorithm 1 (Lu and De Sa, ICML 2020) in its
    order: the gradients were computed at this worker's parameters ``x`` (your
    ``loss.backward()``); ``x`` is averaged with the graph neighbours' (``x + Σ_j W_ij (x̂_j −
    x̂_i)``, the cluster's ``[gossip]`` mixing matrix, a ring by default, relayed by the
    servers); then ``optimizer.step()`` applies the gradient to the average. Gradients are
    never exchanged.

    ``compression_params`` is every parameter's map (the message codec): ``{"compressor":
    "moniqua", "theta": "1", "theta_schedule": "lr", "bits": "2"}`` for Moniqua, ``{}`` (the
    default) for full-precision D-PSGD, ``{"compressor": "minmax", "bits": "2"}`` for naive
    quantised averaging; ``exchange = "gossip"`` is added. With ``"theta_schedule": "lr"``
    Moniqua's θ is ``theta`` times the learning rate of the parameter's group at each step (the
    paper's θ ∝ α, which tightens the bound as a schedule decays the rate); with
    ``"theta_schedule": "bound"`` it is ``theta`` times the paper's Theorem 2 bound
    ``2·α·G·ln(16n)/(1 − ρ)``, ``G`` the largest ``|grad|`` of the parameter this worker has
    seen (each step reports ``p.grad.abs().max()`` before the exchange). Parameters are
    declared ``PREFIX + NAME`` (default ``"Gossip."``) in ``named_parameters`` order, and rank
    0's are broadcast at construction, so every worker starts from the same model (the paper's
    assumption).

    ``buffers`` (e.g. batch-norm running statistics, from ``module.named_buffers()``) are
    either kept local (``buffers_mode="local"``, the default: each worker's statistics follow
    its own data) or averaged over every worker after each step, uncompressed
    (``buffers_mode="average"``, through the servers). Integer buffers
    (``num_batches_tracked``) always stay local.

    Parameters travel through float32 host copies (CUDA tensors are copied to the host and
    back): the gossip path has no device kernels yet. What is evaluated in the paper is the
    workers' mean model; :meth:`mean_model` gives it (a broadcast from every rank).

    Other attributes (``param_groups``, ``zero_grad``, ``state_dict``, ...) are the wrapped
    optimizer's."""

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        named_parameters: Iterable[Tuple[str, torch.Tensor]],
        compression_params: Optional[Mapping[str, str]] = None,
        buffers: Optional[Iterable[Tuple[str, torch.Tensor]]] = None,
        buffers_mode: str = "local",
        prefix: str = "Gossip.",
    ):
        if buffers_mode not in ("local", "average"):
            raise ValueError(f"buffers_mode = {buffers_mode!r}: expected 'local' or 'average'")
        _check_running("DecentralizedOptimizer")
        self._opt = optimizer
        # (declared name, the caller's name, parameter)
        self._params: List[Tuple[str, str, torch.Tensor]] = []
        for name, p in named_parameters:
            if p.dtype not in _CONVERTIBLE:
                raise TypeError(f"parameter {name!r} has dtype {p.dtype}: gossip averages floats")
            self._params.append((f"{prefix}{name}", name, p))
        cmap: Dict[str, str] = {str(k): str(v) for k, v in (compression_params or {}).items()}
        if cmap.get("exchange", "gossip") != "gossip":
            raise ValueError(
                f"compression_params has exchange = {cmap['exchange']!r}: the decentralised "
                "optimizer gossips its parameters (leave exchange out)"
            )
        cmap["exchange"] = "gossip"
        self.compression_params = cmap
        # Parameter groups whose learning rate the codec reads each step (theta_schedule = lr
        # or bound); with bound, each gradient's largest magnitude is reported too.
        self._lr_of = None
        schedule = cmap.get("theta_schedule")
        self._track = schedule == "bound"
        if schedule in ("lr", "bound"):
            group_of = {id(p): g for g in optimizer.param_groups for p in g["params"]}
            missing = [n for _, n, p in self._params if id(p) not in group_of]
            if missing:
                raise ValueError(
                    f"theta_schedule = {schedule!r} reads each parameter's learning rate from "
                    f"the optimizer, which does not hold {missing[:3]}"
                )
            self._lr_of = [group_of[id(p)] for _, _, p in self._params]
        for i, (name, _, p) in enumerate(self._params):
            declare(name, p, cmap, -i)
        broadcast_parameters({name: p for name, _, p in self._params}, root_rank=0, prefix="")
        self._prefix = prefix
        self._buffers: List[Tuple[str, torch.Tensor]] = []
        if buffers_mode == "average":
            self._buffers = [
                (f"{prefix}buffer.{n}", b)
                for n, b in (buffers or [])
                if b.dtype in _CONVERTIBLE
            ]

    def __getattr__(self, name):
        return getattr(self._opt, name)

    def gossip(self) -> None:
        """Averages every parameter with the graph neighbours' (one round of each, all in
        flight at once), in place."""
        rounds = []
        for i, (name, _, p) in enumerate(self._params):
            r = _Round(name, p.data, host_only=True)
            _check_running(f"gossip of {name!r}")
            if self._lr_of is not None:
                _w().set_learning_rate(float(self._lr_of[i]["lr"]))
            if self._track and p.grad is not None:
                _w().report_gradient_bound(name, float(p.grad.detach().abs().max()))
            r.native = _w().gossip(*r.entry())
            rounds.append(r)
        for r in rounds:
            r.finish()

    def step(self, closure=None):
        """Algorithm 1's step: :meth:`gossip`, then the wrapped optimizer's ``step`` (which
        applies the gradients computed before the call), then the buffers' average if asked
        for. Returns what the optimizer's ``step`` returns."""
        self.gossip()
        out = self._opt.step(closure) if closure is not None else self._opt.step()
        if self._buffers:
            push_pull_group_inplace([b for _, b in self._buffers], average=True,
                                    names=[n for n, _ in self._buffers])
        return out

    def mean_model(self) -> Dict[str, torch.Tensor]:
        """The mean of every worker's parameters (what Moniqua's paper evaluates), by the
        names given at construction (without the prefix), the same on every worker: each
        rank's parameters broadcast in turn and summed in rank order in float64. A collective."""
        from ._state import size

        total = {name: torch.zeros(p.shape, dtype=torch.float64) for _, name, p in self._params}
        for root in range(size()):
            theirs = {name: p.detach().to("cpu", torch.float32).clone() for _, name, p in self._params}
            broadcast_parameters(theirs, root_rank=root, prefix=f"{self._prefix}mean.")
            for name, t in theirs.items():
                total[name] += t.to(torch.float64)
        n = float(size())
        return {name: (t / n).to(torch.float32) for name, t in total.items()}
