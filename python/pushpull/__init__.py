"""pushpull: a parameter server for data-parallel training with per-tensor gradient compression.

The Python package binds pushpull's Rust worker library (``pushpull._native``); nothing of the
protocol or the compressors is implemented in Python.

* ``pushpull.torch``: BytePS's PyTorch API (``import pushpull.torch as bps``), with pushpull's
  per-tensor compression on top.
* ``pushpull.BUILD_PROFILE``: ``"release"``, or ``"debug"`` for an extension built with debug
  assertions (``--profile dev``), whose compressors run several times slower.
* ``pushpull.PushPullError``: every failure (the message names the tensor, key or node), a
  ``RuntimeError`` as Horovod's ``HorovodInternalError`` is;
  ``pushpull.NodeLostError``: the job is over because a node was lost (named in the message).

Start a job with ``pushpull local --workers N -- python train.py`` (see the README).
"""

from ._native import BUILD_PROFILE, NodeLostError, PushPullError, Reference, Worker
from ._env import JoinSettings, join_settings

__all__ = [
    "BUILD_PROFILE",
    "JoinSettings",
    "NodeLostError",
    "PushPullError",
    "Reference",
    "Worker",
    "join_settings",
]
