"""``pushpull.torch.parallel``: BytePS's ``byteps.torch.parallel``, the
:class:`DistributedDataParallel` module wrapper (in ``distributed.py``)."""

from .distributed import DistributedDataParallel

__all__ = ["DistributedDataParallel"]
