"""``Compression`` of :mod:`pushpull.torch`: BytePS's compression choices, each the parameter
map of pushpull's per-tensor compression that it stands for. Used by :func:`push_pull` and
its forms (``compression=``), :class:`DistributedOptimizer` and
:class:`pushpull.torch.parallel.DistributedDataParallel`. A user-defined compressor in
Horovod's and BytePS's shape (a class or object with ``compress(tensor) -> (tensor, ctx)`` and
``decompress(tensor, ctx) -> tensor``) is honoured by :func:`push_pull`'s forms and
``allreduce``'s (:class:`_UserCompressor`).
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


class _UserCompressor(_Compressor):
    """A user-defined compressor, as Horovod and BytePS run one: ``compress(tensor)`` on the
    worker gives the tensor that the round sums (in the dtypes a round sums: float32, float64,
    float16, bfloat16, the integers) and a context; ``decompress(sum, ctx)`` gives the
    result. It adds nothing to the tensor's parameter map."""

    def __init__(self, user):
        super().__init__(getattr(user, "__name__", type(user).__name__), {})
        self.user = user

    def compress(self, tensor):
        out = self.user.compress(tensor)
        if not (isinstance(out, tuple) and len(out) == 2):
            raise TypeError(
                f"compression = {self.name}: compress(tensor) returned {type(out).__name__}; "
                "expected a (tensor, ctx) pair, as Horovod's Compressor.compress"
            )
        return out

    def decompress(self, tensor, ctx):
        return self.user.decompress(tensor, ctx)

    def __repr__(self) -> str:
        return self.name


def compressor_of(params: Optional[Mapping[str, str]]) -> str:
    """The compressor a parameter map names (``"none"`` when it names none)."""
    for k in COMPRESSOR_KEYS:
        if params and k in params:
            return params[k]
    return "none"


def check_compression(compression) -> _Compressor:
    """``compression`` if it is one of :class:`Compression`'s choices, or a user-defined
    compressor (callable ``compress`` and ``decompress``) as a :class:`_UserCompressor`;
    raises ``TypeError`` naming the argument otherwise."""
    if isinstance(compression, _Compressor):
        return compression
    if callable(getattr(compression, "compress", None)) and callable(
        getattr(compression, "decompress", None)
    ):
        return _UserCompressor(compression)
    raise TypeError(
        f"compression = {compression!r}: expected Compression.none, Compression.fp16 or a "
        "compressor with compress(tensor) -> (tensor, ctx) and decompress(tensor, ctx) (other "
        "compressors: declare(name, **params) or a parameter map)"
    )
