"""Declaring tensors: :func:`declare` (pushpull's form, declared now, and BytePS's
``declare(name, **kwargs)``, declared at the first round), :func:`_ensure_declared` (a round's
tensor declared, or checked against its declaration), and the checks of parameter maps and of
BytePS's ``version`` / ``staleness``."""

from __future__ import annotations

import math
from typing import Dict, Mapping, Optional, Union

import torch

from .._native import PushPullError
from . import _state
from ._round import _INTEGER, _Round
from ._state import _check_running, _Decl, _w
from .compression import _Compressor, compressor_of

ParamMap = Mapping[str, str]


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


def _with_rows(cmap: Mapping[str, str], shape) -> Dict[str, str]:
    """``cmap`` with PowerSGD's ``rows``, the tensor's first dimension (torch's hook views a
    gradient as ``view(shape[0], -1)``; a 0-d tensor has one row), where the map names
    ``powersgd`` and does not say it."""
    out = dict(cmap)
    if compressor_of(out) == "powersgd" and "rows" not in out and "pieces" not in out:
        out["rows"] = str(shape[0] if len(shape) > 0 else 1)
    return out


def _with_pieces(cmap: Mapping[str, str], shapes) -> Dict[str, str]:
    """``cmap`` for one tensor holding gradients of ``shapes`` one after another (a bucket),
    with PowerSGD's ``pieces`` in place of ``rows``: each gradient as torch's hook views it,
    ``ROWSxCOLS`` (``view(shape[0], -1)``) or ``N`` for a vector."""
    def piece(shape) -> str:
        n = math.prod(shape)
        return f"{shape[0]}x{n // shape[0]}" if len(shape) > 1 and n > 0 else str(n)
    out = {k: v for k, v in cmap.items() if k != "rows"}
    out["pieces"] = ",".join(piece(tuple(s)) for s in shapes)
    return out


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
    known = _state.declared.get(name)
    if tensor is None:
        if known is not None:
            if cmap and cmap != known.params:
                raise ValueError(
                    f"tensor {name!r} was declared with the map {known.params}; this call asks "
                    f"for {cmap} (a tensor's map is fixed when it is declared)"
                )
            return
        pending = _state.pending.get(name)
        if pending is not None and pending != (cmap, priority):
            raise ValueError(
                f"tensor {name!r} was declared with the map {pending[0]} and priority "
                f"{pending[1]}; this call asks for {cmap} and {priority}"
            )
        _state.pending[name] = (cmap, priority)
        return
    # A pending map is dropped only once the native declare has succeeded: a declaration
    # refused (suspended, a bad map) leaves it for the next try.
    pending = _state.pending.get(name)
    if pending is not None:
        cmap = {**pending[0], **cmap}
        priority = pending[1] if priority is None else priority
    numel = tensor if isinstance(tensor, int) else _native_numel(tensor)
    if isinstance(tensor, torch.Tensor):
        cmap = _with_rows(cmap, tensor.shape)
    _check_running("declare")
    prio, codecs = _w().declare(name, numel, cmap or None, priority)
    _state.declared[name] = _Decl(numel, prio, cmap, list(codecs))
    _state.pending.pop(name, None)


def _ensure_declared(
    name: str, r: _Round, priority: int, compression: Optional[_Compressor] = None
) -> None:
    """Declares the tensor of round ``r`` if it is new (with the map of a pending
    ``declare(name, **kwargs)`` and ``compression``'s), else checks the call against the
    declaration: length, priority, compressor, and for integers an uncompressed map."""
    numel = r.work.numel()
    cmap = compression.params if compression is not None else {}
    known = _state.declared.get(name)
    if known is None:
        if _w().is_declared(name):
            raise PushPullError(f"tensor {name!r} was declared through another API")
        pmap, pprio = _state.pending.get(name, ({}, None))
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
        prio = pprio if pprio is not None else (priority if priority != 0 else None)
        full = _with_rows({**pmap, **cmap}, r.shape)
        declare(name, numel, full, prio)  # drops the pending map once declared
        known = _state.declared[name]
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
