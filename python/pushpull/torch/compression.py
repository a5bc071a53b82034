"""``Compression`` of :mod:`pushpull.torch`: BytePS's compression choices, each the parameter
map of pushpull's per-tensor compression that it stands for. Used by :func:`push_pull` and
its forms (``compression=``), :class:`DistributedOptimizer` and
:class:`pushpull.torch.parallel.DistributedDataParallel`.
"""

from __future__ import annotations

from typing import Mapping, Optional

# The keys that name a tensor's compressor (the short name and BytePS's spelling).
COMPRESSOR_KEYS = ("compressor", "byteps_compressor_type")


class _Compressor:
    """A BytePS compression choice, as the parameter map it stands for."""

    def __init__(self, name: str, params: Mapping[str, str]):
        self.name = name
        self.params = dict(params)

    def __repr__(self) -> str:
        return f"Compression.{self.name}"


class Compression:
    """BytePS's compression choices. ``fp16`` is pushpull's fp16 compressor (workers send
    float16, servers sum in float32); ``none`` adds no compressor (a tensor keeps the map it
    was declared with). For every other compressor, error feedback or momentum, use
    :func:`declare`'s map or ``DistributedOptimizer(..., compression_params=...)``."""

    none = _Compressor("none", {})
    fp16 = _Compressor("fp16", {"byteps_compressor_type": "fp16"})


def compressor_of(params: Optional[Mapping[str, str]]) -> str:
    """The compressor a parameter map names (``"none"`` when it names none)."""
    for k in COMPRESSOR_KEYS:
        if params and k in params:
            return params[k]
    return "none"


def check_compression(compression) -> _Compressor:
    """``compression`` if it is one of :class:`Compression`'s choices; raises ``TypeError``
    naming the argument otherwise."""
    if not isinstance(compression, _Compressor):
        raise TypeError(
            f"compression = {compression!r}: expected Compression.none or Compression.fp16 "
            "(other compressors: declare(name, **params) or a parameter map)"
        )
    return compression
