"""pushpull.torch.SyncBatchNorm (Horovod's) on 2 workers against torch's BatchNorm1d over
both workers' inputs at once in one process: outputs, input gradients, the weight's and
bias's gradients summed over the workers, running statistics, and evaluation."""

import torch

from conftest import run_job


def test_sync_batchnorm_normalises_over_every_workers_batch(pushpull, seed, tmp_path):
    p = run_job(pushpull, "sync_batchnorm.py", tmp_path, seed)
    assert p.returncode == 0, p.stderr
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(2)]
    n = ranks[0]["size"]
    x = torch.randn(2 * n, 6, 5, generator=torch.Generator().manual_seed(seed)) * 3 + 1
    bn = torch.nn.BatchNorm1d(6)
    with torch.no_grad():
        bn.weight.copy_(torch.linspace(0.5, 2.0, 6))
        bn.bias.copy_(torch.linspace(-1.0, 1.0, 6))
    close = dict(rtol=1e-4, atol=1e-5)
    for step in range(2):
        whole = x.clone().requires_grad_(True)
        y = bn(whole)
        # Each worker's loss weighs its own half as the job does (the same weights per half).
        w = torch.arange(2 * 6 * 5).view(2, 6, 5).float().sin()
        (y * torch.cat([w] * n)).sum().backward()
        for s in ranks:
            r = s["rank"]
            assert torch.allclose(s[f"y{step}"], y[2 * r:2 * r + 2].detach(), **close), (r, step)
            assert torch.allclose(s[f"dx{step}"], whole.grad[2 * r:2 * r + 2], **close), (r, step)
    # The parameters' gradients: each worker's part, summed over the workers, is the whole's.
    dw = sum(s["dw"] for s in ranks)
    db = sum(s["db"] for s in ranks)
    assert torch.allclose(dw, bn.weight.grad, **close) and torch.allclose(db, bn.bias.grad, **close)
    for s in ranks:
        mean, var = s["running"]
        assert torch.allclose(mean, bn.running_mean, **close)
        assert torch.allclose(var, bn.running_var, **close)
        bn.eval()
        r = s["rank"]
        assert torch.allclose(s["eval"], bn(x[2 * r:2 * r + 2]).detach(), **close)
        bn.train()
