"""What test_optimizer.py and its workers (jobs/optimizer.py) share: the model, the data, and
per mode the compression map and the backward passes per step."""

import torch

STEPS = 5
WORKERS = 2
MAPS = {
    "none": None,
    "onebit": {"byteps_compressor_type": "onebit", "byteps_ef_type": "vanilla",
               "byteps_momentum_type": "nesterov"},
    # Learning-rate corrected error feedback: the worker reads the lr from param_groups.
    "corrected": {"byteps_compressor_type": "onebit", "byteps_ef_type": "corrected"},
    # BytePS's Compression.fp16 (the job passes compression=, not compression_params=).
    "fp16": {"byteps_compressor_type": "fp16"},
    # Two backward passes per step, gradients accumulated locally before the push_pull.
    "accumulate": None,
    # Mixed precision: a loss scaler, and rank 1's gradients overflowing at one step (AMP).
    "amp": {"byteps_compressor_type": "onebit", "byteps_ef_type": "vanilla",
            "byteps_momentum_type": "nesterov"},
    # QSGD's Elias code (the `dithering-elias` preset): no GPU kernel, so the emulated route
    # compresses it on the CPU.
    "elias": {"byteps_compressor_type": "dithering", "byteps_compressor_k": "4",
              "bucket": "512", "encoding": "elias"},
    # Onebit with error feedback under Adam (OPTIMIZERS), the updates averaged
    # (average="updates", AVERAGES).
    "updates": {"byteps_compressor_type": "onebit", "byteps_ef_type": "vanilla"},
    # The same with AdamW and average="auto", which takes "momentum": WARMUP steps of
    # uncompressed gradients, then the first moment averaged and the second frozen.
    "momentum": {"byteps_compressor_type": "onebit", "byteps_ef_type": "vanilla"},
    # The same with the warm-up's gradients as fp16 (warmup_compression="fp16").
    "momentum16": {"byteps_compressor_type": "onebit", "byteps_ef_type": "vanilla"},
    # PowerSGD at rank 2 after one uncompressed step (DistributedOptimizer fills in each
    # tensor's `rows`); no device kernel: the emulated route copies it to the host.
    "powersgd": {"byteps_compressor_type": "powersgd", "rank": "2", "start_iter": "1"},
}
# DistributedOptimizer's average= per mode (default "auto"), its warmup_steps and
# warmup_compression (default "none").
AVERAGES = {"updates": "updates"}
WARMUP = 2
WARMUP_COMPRESSION = {"momentum16": "fp16"}
PASSES = {"accumulate": 2}
# The optimizer of a mode (default: plain SGD), made around the parameters at lr 0.1.
OPTIMIZERS = {
    "updates": lambda params: torch.optim.Adam(params, lr=0.1),
    "momentum": lambda params: torch.optim.AdamW(params, lr=0.1, betas=(0.9, 0.95),
                                                 weight_decay=0.1),
}
OPTIMIZERS["momentum16"] = OPTIMIZERS["momentum"]


def make_optimizer(mode: str, params) -> torch.optim.Optimizer:
    return OPTIMIZERS.get(mode, lambda ps: torch.optim.SGD(ps, lr=0.1))(params)
# AMP: the loss scaler's first scale, and the (step, rank) whose input holds inf.
AMP_SCALE = 2.0**12
AMP_OVERFLOW = (2, 1)


def lr_at(step: int) -> float:
    """A schedule that changes every step, so a stale learning rate shows."""
    return 0.1 / (1 + step)


def make_model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))


def batch(seed: int, step: int, rank: int, micro: int = 0):
    g = torch.Generator().manual_seed(seed * 7919 + step * 31 + rank + 100_003 * micro)
    return torch.randn(32, 64, generator=g), torch.randint(0, 10, (32,), generator=g)


def overflow(model: torch.nn.Module, mode: str, step: int, rank: int):
    """In AMP mode at AMP_OVERFLOW, makes one row of the first layer's weight gradient inf
    (one chunk of one tensor overflows; the step's other gradients stay finite, so their
    rounds change state that the skipped step must discard). Returns the hook's handle."""
    if mode != "amp" or (step, rank) != AMP_OVERFLOW:
        return None
    return model[0].weight.register_hook(lambda g: g.index_fill(0, torch.tensor([3]), float("inf")))
