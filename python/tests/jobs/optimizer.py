"""A worker of test_optimizer.py: trains a small MLP with DistributedOptimizer for a few steps
on its own random batches and saves the final parameters. Usage: optimizer.py OUT SEED MODE
BUCKET_MB [ordered], MODE one of optimizer_common.MAPS, BUCKET_MB the optimizer's
bucket_cap_mb, `ordered` for ordered_step=True (it saves how many steps left their rounds'
outcomes for later)."""

import os
import sys

import torch

import pushpull.torch as bps

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from optimizer_common import (  # noqa: E402
    AMP_SCALE, AVERAGES, MAPS, PASSES, STEPS, WARMUP, WARMUP_COMPRESSION, batch, lr_at,
    make_model, make_optimizer, overflow,
)

out, seed, mode, cap = sys.argv[1], int(sys.argv[2]), sys.argv[3], float(sys.argv[4])
ordered = sys.argv[5:] == ["ordered"]
torch.set_num_threads(1)
bps.init()
r = bps.rank()
model = make_model(seed + 1000 * r)  # different on purpose: the broadcast must fix it
bps.broadcast_parameters(model.state_dict(), root_rank=0)
opt = make_optimizer(mode, model.parameters())
passes = PASSES.get(mode, 1)
if mode == "fp16":
    opt = bps.DistributedOptimizer(opt, model.named_parameters(), compression=bps.Compression.fp16,
                                   bucket_cap_mb=cap, ordered_step=ordered)
else:
    opt = bps.DistributedOptimizer(opt, model.named_parameters(), compression_params=MAPS[mode],
                                   backward_passes_per_step=passes, bucket_cap_mb=cap,
                                   ordered_step=ordered, average=AVERAGES.get(mode, "auto"),
                                   warmup_steps=WARMUP,
                                   warmup_compression=WARMUP_COMPRESSION.get(mode, "none"))
deferred = 0
# Mixed precision as with Horovod: synchronize, then the scaler's step without synchronizing.
scaler = torch.amp.GradScaler("cpu", init_scale=AMP_SCALE) if mode == "amp" else None
for step in range(STEPS):
    for group in opt.param_groups:
        group["lr"] = lr_at(step)
    opt.zero_grad()
    hook = overflow(model, mode, step, r)
    for micro in range(passes):
        x, y = batch(seed, step, r, micro)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        (scaler.scale(loss) if scaler else loss).backward()
    if hook:
        hook.remove()
    if scaler:
        opt.synchronize()
        with opt.skip_synchronize():
            scaler.step(opt)
        scaler.update()
    else:
        opt.step()
        deferred += opt._deferred is not None
torch.save({"state": model.state_dict(), "job_seed": bps._w().job_seed,
            "scale": scaler.get_scale() if scaler else None, "deferred": deferred,
            "metrics": bps.metrics()}, os.path.join(out, f"rank{r}.pt"))
bps.shutdown()
print("done")
