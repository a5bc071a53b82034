"""Checkpoint and restart: :func:`save_state` and :func:`load_state`, the compressor state a
restarted job needs to continue as if it never stopped (error-feedback residuals, momentum,
each tensor's round, the learning rate of corrected error feedback, and in rank 0's file the
servers' state). The model's and optimizer's own state is the training script's to save, as
with ``torch.save``."""

from __future__ import annotations

import os
from typing import Union

from . import _state
from ._state import _w

PathLike = Union[str, "os.PathLike[str]"]


def save_state(path: PathLike) -> None:
    """Saves this worker's compressor state to ``path``: a collective, called by every worker
    at the same point between steps (after the step's rounds are synchronized), each with its
    own file, e.g. ``f"ckpt/pushpull-{bps.rank()}.bin"`` next to the model's checkpoint.
    Rank 0's file also carries every server's state, and state kept on a GPU is copied from
    it. A step skipped just before (its rounds discarded, :func:`discard_last_round`) is saved
    undone, and the restarted job's next rounds are those of the job that saved it. Raises
    ``PushPullError`` naming the file and why (it cannot be written; a server refused)."""
    w = _w()
    _state.collect_deferred()
    w.save_state(os.fspath(path))


def load_state(path: PathLike) -> None:
    """Restores the state :func:`save_state` wrote to ``path`` into a freshly started job: a
    collective, called by every worker with its own file once every tensor of the checkpoint
    is declared (``DistributedOptimizer`` declares every parameter when it is made;
    :func:`declare` declares others) and before the first round. The job must have the
    settings that change results (workers, servers, chunking, local size, the job seed: set
    ``cluster.seed`` to the saved one, which the error names; each tensor's length and
    parameter map); timeouts and windows may differ. Raises ``PushPullError`` naming the
    setting that differs, or what is wrong with the file, and then changes nothing."""
    _w().load_state(os.fspath(path))
