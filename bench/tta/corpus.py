"""The corpus of the time-to-accuracy workloads: the Python standard library's own source text,
read from the interpreter that runs this file, so that nothing is downloaded and every worker
host with the same Python reads the same bytes.

What is read: every ``*.py`` file under ``sysconfig.get_paths()["stdlib"]``, except those with
a folder named ``site-packages``, ``dist-packages``, ``test``, ``tests``, ``idlelib`` or
``__pycache__`` on their path below that root (symbolic links to folders are not followed),
sorted by their path relative to the root (``/``-separated). Each file goes whole to the
validation split when the first 8 bytes of the SHA-256 of its relative path, read as a
big-endian integer, are 0 modulo 20 (about 5 % of the files), else to the training split: the
split is by file and does not depend on anything but the path. Each split is its files'
bytes concatenated in path order; the vocabulary is the 256 byte values.

Nothing is cached outside the process: the corpus is about 11 MB (674 files with CPython
3.11.7), read again by each process that asks for it (:func:`load`).

Batches (:func:`train_batch`) are drawn from a generator seeded by ``(seed, step, rank)``:
the same for every system and independent of timing. Validation (:func:`val_windows`) is a
fixed, seeded set of windows of the validation split.
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Tuple

import numpy as np
import torch

# Folders whose files are left out, wherever they are below the root.
EXCLUDED_DIRS = frozenset(
    {"site-packages", "dist-packages", "test", "tests", "idlelib", "__pycache__"}
)
# A file is a validation file when the hash of its relative path is 0 modulo this.
VAL_MODULUS = 20


@dataclass(frozen=True)
class Corpus:
    """The two splits as uint8 tensors, and :func:`describe`'s record of what was read."""

    train: torch.Tensor
    val: torch.Tensor
    info: Dict[str, object]


def stdlib_root() -> Path:
    """The standard library folder of the running interpreter."""
    return Path(sysconfig.get_paths()["stdlib"])


def list_files(root: Path) -> List[str]:
    """The corpus's files: relative, ``/``-separated paths of the ``*.py`` files under
    ``root`` outside :data:`EXCLUDED_DIRS`, sorted."""
    out = []
    for here, dirs, files in os.walk(root):  # followlinks=False: no folder is read twice
        dirs[:] = [d for d in dirs if d not in EXCLUDED_DIRS]
        rel_dir = Path(here).relative_to(root)
        for name in files:
            if name.endswith(".py") and os.path.isfile(os.path.join(here, name)):
                out.append((rel_dir / name).as_posix())
    return sorted(out)


def is_validation(rel_path: str) -> bool:
    """Whether the file at ``rel_path`` belongs to the validation split (a stable hash of the
    path modulo :data:`VAL_MODULUS` is 0)."""
    h = hashlib.sha256(rel_path.encode("utf-8")).digest()
    return int.from_bytes(h[:8], "big") % VAL_MODULUS == 0


@functools.lru_cache(maxsize=1)
def load() -> Corpus:
    """Reads the corpus (once per process) and returns both splits with their description.

    The hash, ``sha256``, covers every file in sorted order: its relative path (UTF-8), a NUL
    byte, its length as 8 big-endian bytes, then its bytes; it names the corpus across
    machines whatever the root's absolute path is."""
    root = stdlib_root()
    paths = list_files(root)
    if not paths:
        raise RuntimeError(f"no *.py files found under the standard library folder {root}")
    digest = hashlib.sha256()
    train_parts, val_parts = [], []
    val_files: List[str] = []
    for rel in paths:
        data = (root / rel).read_bytes()
        digest.update(rel.encode("utf-8") + b"\0" + len(data).to_bytes(8, "big"))
        digest.update(data)
        if is_validation(rel):
            val_parts.append(data)
            val_files.append(rel)
        else:
            train_parts.append(data)
    train = b"".join(train_parts)
    val = b"".join(val_parts)
    info = {
        "source": "python-stdlib",
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "root": str(root),
        "files": len(paths),
        "bytes": len(train) + len(val),
        "train_files": len(paths) - len(val_files),
        "train_bytes": len(train),
        "val_files": len(val_files),
        "val_bytes": len(val),
        "val_rule": f"sha256(relative path)[:8] big-endian % {VAL_MODULUS} == 0",
        "sha256": digest.hexdigest(),
    }
    as_tensor = lambda b: torch.frombuffer(bytearray(b), dtype=torch.uint8)  # noqa: E731
    return Corpus(train=as_tensor(train), val=as_tensor(val), info=info)


def describe() -> Dict[str, object]:
    """What the corpus is: Python version and implementation, the standard library folder it
    was read from, the file and byte counts in all and per split, the split rule, and the
    SHA-256 of the sorted paths and contents (see :func:`load`)."""
    return dict(load().info)


def split_files() -> Tuple[List[str], List[str]]:
    """The relative paths of the training files and of the validation files."""
    paths = list_files(stdlib_root())
    val = [p for p in paths if is_validation(p)]
    train = [p for p in paths if not is_validation(p)]
    return train, val


def _windows(data: torch.Tensor, starts: np.ndarray, length: int) -> torch.Tensor:
    idx = torch.from_numpy(starts).long()[:, None] + torch.arange(length)[None, :]
    return data[idx].long()


def train_batch(seed: int, step: int, rank: int, batch: int, seq_len: int
                ) -> Tuple[torch.Tensor, torch.Tensor]:
    """Rank ``rank``'s batch of step ``step``: ``batch`` contiguous windows of ``seq_len + 1``
    bytes of the training split, at offsets drawn uniformly by a NumPy generator seeded with
    ``[seed, step, rank]``. Returns ``(inputs, targets)``, int64 tensors of shape
    ``(batch, seq_len)``, targets shifted by one byte."""
    data = load().train
    rng = np.random.default_rng([seed, step, rank])
    starts = rng.integers(0, len(data) - seq_len - 1, size=batch, endpoint=True)
    w = _windows(data, starts, seq_len + 1)
    return w[:, :-1], w[:, 1:]


def val_windows(seed: int, count: int, seq_len: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """The fixed validation set: ``count`` windows of ``seq_len + 1`` bytes of the validation
    split at offsets drawn by a NumPy generator seeded with ``[seed, 2**32 - 1]`` (no training
    step uses that seed: steps are below 2**32 - 1). Returns ``(inputs, targets)`` as
    :func:`train_batch` does."""
    data = load().val
    if len(data) < seq_len + 1:
        raise ValueError(f"the validation split ({len(data)} bytes) is shorter than a window "
                         f"of {seq_len + 1}")
    rng = np.random.default_rng([seed, 2**32 - 1])
    starts = rng.integers(0, len(data) - seq_len - 1, size=count, endpoint=True)
    w = _windows(data, starts, seq_len + 1)
    return w[:, :-1], w[:, 1:]
