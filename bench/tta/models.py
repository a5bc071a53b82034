"""The time-to-accuracy workloads: two byte-level language models on the corpus of
``corpus.py``, each with its own optimizer and learning-rate schedule, and named default sizes.

``transformer``
    A decoder-only transformer: learned token and position embeddings, ``n_layer`` pre-LN
    blocks (causal self-attention through ``torch.nn.functional.scaled_dot_product_attention``
    with ``is_causal=True``, then a 4x GELU MLP), a final LayerNorm and a head onto the 256
    byte values, tied to the token embedding unless ``tie`` is 0. Trained with AdamW
    (betas 0.9, 0.95; weight decay on matrices only), linear warm-up, then cosine decay to
    10 % of the peak learning rate at the last step.
``conv``
    A causal convolutional language model: a token embedding, ``n_layer`` residual blocks
    (a LayerNorm over channels at each position, a dilated causal ``Conv1d`` of width
    ``kernel`` and ``2 * d_model`` channels with left padding only, GELU, a 1x1 ``Conv1d`` back
    to ``d_model``), a final LayerNorm and a head. Dilations go 1, 2, 4, ... up to
    ``2**(dilation_cycle - 1)`` and start again. Trained with torch's SGD, momentum 0.9,
    optional weight decay, linear warm-up, then cosine decay to 10 % (``schedule = cosine``) or
    steps of x0.1 at half and three quarters of the run (``schedule = step``).

Neither model has buffers (nothing for DDP to broadcast during training) or dropout, so a
step depends only on the parameters and the batch.

Sizes: :data:`SIZES` holds each workload's named sizes (``default`` among them); any field can
be overridden (``train.py --size NAME --set field=value``).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields, replace
from typing import Dict, List, Tuple

import torch
import torch.nn.functional as F
from torch import nn

VOCAB = 256


@dataclass(frozen=True)
class Size:
    """A workload's shape and its optimizer's hyper-parameters (the fields a size may set).

    ``lr`` is the peak learning rate, ``warmup`` the warm-up steps, ``clip`` the largest
    global gradient norm (0: no clipping), ``weight_decay`` AdamW's (transformer) or SGD's
    (conv). ``tie``, ``n_head`` are the transformer's; ``kernel``, ``dilation_cycle``,
    ``schedule`` the conv LM's (ignored by the other)."""

    d_model: int
    n_layer: int
    seq_len: int
    batch: int
    lr: float
    warmup: int
    clip: float
    weight_decay: float
    n_head: int = 4
    tie: int = 1
    kernel: int = 3
    dilation_cycle: int = 6
    schedule: str = "cosine"


WORKLOADS = ("transformer", "conv")

# Named sizes per workload. `default` is the size a run takes unless told otherwise; `tiny` is
# for tests (seconds on one core). The defaults are sized as bench/tta/README.md says
# ("Sizing"): with 4 workers on this 2-core machine at 100 Mbit/s, DDP fp32's step over its
# step with the `noop` hook is 7.3x for the transformer (842,496 parameters, 3.37 MB of
# float32 gradients; 0.497 s against 0.068 s; with batch 4, 5.1x) and 6.5x for the conv LM
# (1,119,744 parameters, 4.48 MB; 0.686 s against 0.106 s), measured 2026-11-29.
SIZES: Dict[str, Dict[str, Size]] = {
    "transformer": {
        "tiny": Size(d_model=32, n_layer=1, n_head=2, seq_len=32, batch=8, lr=3e-3, warmup=2,
                     clip=1.0, weight_decay=0.1),
        "default": Size(d_model=128, n_layer=4, n_head=4, seq_len=128, batch=2, lr=2e-3,
                        warmup=50, clip=1.0, weight_decay=0.1),
    },
    "conv": {
        "tiny": Size(d_model=32, n_layer=2, seq_len=32, batch=8, lr=0.05, warmup=2, clip=1.0,
                     weight_decay=0.0, kernel=3, dilation_cycle=2),
        "default": Size(d_model=128, n_layer=8, seq_len=96, batch=4, lr=0.1, warmup=50,
                        clip=1.0, weight_decay=0.0, kernel=3, dilation_cycle=6),
    },
}


def size_of(workload: str, name: str, overrides: Dict[str, str]) -> Size:
    """The named size ``name`` of ``workload`` with ``overrides`` (field name -> text) applied,
    each text converted to the field's type. Raises ``ValueError`` naming an unknown workload,
    size or field, or a value that does not convert."""
    if workload not in SIZES:
        raise ValueError(f"unknown workload {workload!r}: one of {', '.join(WORKLOADS)}")
    if name not in SIZES[workload]:
        raise ValueError(f"unknown size {name!r} of {workload}: one of "
                         f"{', '.join(sorted(SIZES[workload]))}")
    base = SIZES[workload][name]
    types = {f.name: type(getattr(base, f.name)) for f in fields(Size)}
    changes = {}
    for key, text in overrides.items():
        if key not in types:
            raise ValueError(f"unknown size field {key!r}: one of {', '.join(types)}")
        try:
            changes[key] = types[key](text)
        except ValueError:
            raise ValueError(f"size field {key}: {text!r} is not a {types[key].__name__}") from None
    size = replace(base, **changes)
    check_size(workload, size)
    return size


def check_size(workload: str, s: Size) -> None:
    """Raises ``ValueError`` naming the first field of ``s`` that ``workload`` cannot use."""
    for key in ("d_model", "n_layer", "seq_len", "batch", "n_head", "kernel", "dilation_cycle"):
        if getattr(s, key) < 1:
            raise ValueError(f"size field {key} = {getattr(s, key)}: must be >= 1")
    if not s.lr > 0:
        raise ValueError(f"size field lr = {s.lr}: must be > 0")
    if s.warmup < 0 or s.clip < 0 or s.weight_decay < 0:
        raise ValueError("size fields warmup, clip, weight_decay must be >= 0")
    if workload == "transformer" and s.d_model % s.n_head:
        raise ValueError(f"d_model = {s.d_model} is not a multiple of n_head = {s.n_head}")
    if s.schedule not in ("cosine", "step"):
        raise ValueError(f"size field schedule = {s.schedule!r}: one of cosine, step")


# --- the transformer ------------------------------------------------------------------------


class _Block(nn.Module):
    def __init__(self, d: int, n_head: int):
        super().__init__()
        self.n_head = n_head
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.out = nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.n_head, d // self.n_head).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class TransformerLM(nn.Module):
    """The ``transformer`` workload's model (see the module's description)."""

    def __init__(self, s: Size):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, s.d_model)
        self.pos = nn.Parameter(torch.zeros(s.seq_len, s.d_model))
        self.blocks = nn.ModuleList(_Block(s.d_model, s.n_head) for _ in range(s.n_layer))
        self.ln_f = nn.LayerNorm(s.d_model)
        self.head = nn.Linear(s.d_model, VOCAB, bias=False)
        self.apply(_init_weights)
        nn.init.normal_(self.pos, std=0.02)
        for blk in self.blocks:  # GPT-2's scaling of the residual projections
            for lin in (blk.proj, blk.out):
                nn.init.normal_(lin.weight, std=0.02 / math.sqrt(2 * s.n_layer))
        if s.tie:
            self.head.weight = self.tok.weight

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """Logits ``(batch, time, 256)`` of the next byte at each position of ``idx``."""
        x = self.tok(idx) + self.pos[: idx.shape[1]]
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln_f(x))


def _init_weights(m: nn.Module) -> None:
    if isinstance(m, (nn.Linear, nn.Embedding)):
        nn.init.normal_(m.weight, std=0.02)
        if getattr(m, "bias", None) is not None:
            nn.init.zeros_(m.bias)


# --- the convolutional LM -------------------------------------------------------------------


class _ChannelNorm(nn.LayerNorm):
    """LayerNorm over the channels of a ``(batch, channels, time)`` tensor, at each position
    on its own (causal, unlike a norm over time)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x.transpose(1, 2)).transpose(1, 2)


class _ConvBlock(nn.Module):
    def __init__(self, d: int, kernel: int, dilation: int):
        super().__init__()
        self.pad = (kernel - 1) * dilation
        self.norm = _ChannelNorm(d)
        self.conv = nn.Conv1d(d, 2 * d, kernel, dilation=dilation)
        self.mix = nn.Conv1d(2 * d, d, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.pad(self.norm(x), (self.pad, 0))  # left only: position t sees t and before
        return x + self.mix(F.gelu(self.conv(y)))


class ConvLM(nn.Module):
    """The ``conv`` workload's model (see the module's description)."""

    def __init__(self, s: Size):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, s.d_model)
        self.blocks = nn.ModuleList(
            _ConvBlock(s.d_model, s.kernel, 2 ** (i % s.dilation_cycle)) for i in range(s.n_layer)
        )
        self.norm = _ChannelNorm(s.d_model)
        self.head = nn.Conv1d(s.d_model, VOCAB, 1)
        for blk in self.blocks:  # each residual branch starts small
            nn.init.normal_(blk.mix.weight, std=0.02 / math.sqrt(s.n_layer))
            nn.init.zeros_(blk.mix.bias)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """Logits ``(batch, time, 256)`` of the next byte at each position of ``idx``."""
        x = self.tok(idx).transpose(1, 2)
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.norm(x)).transpose(1, 2)

    def receptive_field(self) -> int:
        """How many bytes (the current one included) a position's prediction sees."""
        return 1 + sum(blk.pad for blk in self.blocks)


# --- building a workload --------------------------------------------------------------------


def make_model(workload: str, s: Size, seed: int) -> nn.Module:
    """The workload's model, initialised from ``torch.manual_seed(seed)``: the same parameters
    for the same workload, size and seed in every process."""
    torch.manual_seed(seed)
    if workload == "transformer":
        return TransformerLM(s)
    if workload == "conv":
        return ConvLM(s)
    raise ValueError(f"unknown workload {workload!r}: one of {', '.join(WORKLOADS)}")


def make_optimizer(workload: str, model: nn.Module, s: Size) -> torch.optim.Optimizer:
    """The workload's optimizer at its peak learning rate (:func:`lr_at` scales it): AdamW for
    the transformer (weight decay on tensors of 2 or more dimensions only), SGD with momentum
    0.9 for the conv LM."""
    params = list(model.parameters())  # a tied weight once
    if workload == "transformer":
        decay = [p for p in params if p.dim() >= 2]
        rest = [p for p in params if p.dim() < 2]
        groups = [{"params": decay, "weight_decay": s.weight_decay},
                  {"params": rest, "weight_decay": 0.0}]
        return torch.optim.AdamW(groups, lr=s.lr, betas=(0.9, 0.95))
    if workload == "conv":
        return torch.optim.SGD(params, lr=s.lr, momentum=0.9, weight_decay=s.weight_decay)
    raise ValueError(f"unknown workload {workload!r}: one of {', '.join(WORKLOADS)}")


def lr_at(workload: str, s: Size, step: int, steps: int) -> float:
    """The learning rate of step ``step`` (0-based) of a run of ``steps``: linear warm-up over
    ``s.warmup`` steps to ``s.lr``, then cosine decay to ``0.1 * s.lr`` at the last step (the
    transformer's, and the conv LM's with ``schedule = cosine``) or x0.1 at half and x0.01 at
    three quarters of the steps (the conv LM's ``schedule = step``)."""
    if step < s.warmup:
        return s.lr * (step + 1) / s.warmup
    if workload == "conv" and s.schedule == "step":
        return s.lr * (0.01 if step >= 0.75 * steps else 0.1 if step >= 0.5 * steps else 1.0)
    span = max(1, steps - 1 - s.warmup)
    frac = min(1.0, (step - s.warmup) / span)
    return s.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))


def loss_of(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy in nats of the next-byte predictions (divide by ln 2 for bits per
    byte)."""
    logits = model(x)
    return F.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1))


def parameter_count(model: nn.Module) -> int:
    """Trainable elements, a tied weight counted once."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def gradient_bytes(model: nn.Module) -> int:
    """Bytes of float32 gradients a worker hands over per step (every trainable parameter
    once)."""
    return sum(4 * p.numel() for p in model.parameters() if p.requires_grad)


def describe(workload: str, s: Size, model: nn.Module) -> Dict[str, object]:
    """The workload, its size fields, the parameter count and the gradient bytes per step (and
    the conv LM's receptive field)."""
    d: Dict[str, object] = {"workload": workload, "size": asdict(s),
                            "params": parameter_count(model),
                            "grad_bytes": gradient_bytes(model)}
    if isinstance(model, ConvLM):
        d["receptive_field"] = model.receptive_field()
    return d


def parse_overrides(items: List[str]) -> Dict[str, str]:
    """``["field=value", ...]`` as a dict; raises ``ValueError`` naming an item without
    ``=``."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--set {item!r}: expected FIELD=VALUE")
        out[key.strip()] = value.strip()
    return out


__all__: Tuple[str, ...] = (
    "ConvLM", "SIZES", "Size", "TransformerLM", "VOCAB", "WORKLOADS", "check_size", "describe",
    "gradient_bytes", "loss_of", "lr_at", "make_model", "make_optimizer", "parameter_count",
    "parse_overrides", "size_of",
)
