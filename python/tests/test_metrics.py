"""A Python worker's Prometheus endpoint (`PUSHPULL_METRICS`): two workers train through
DistributedOptimizer, each scrapes its own endpoint over HTTP, and what it serves must match
what the job did: the worker's own counters (`pushpull.torch.metrics()`), labelled with its
role and rank, the rounds each gradient ran (one per step) and each broadcast (one), and a
compression ratio far above 1 only for the compressed tensor."""

import json
from pathlib import Path

from conftest import run_job

SMALL = Path(__file__).resolve().parent / "small.toml"
STEPS = 5


def test_a_python_workers_endpoint_serves_what_the_job_did(pushpull, seed, tmp_path, monkeypatch):
    monkeypatch.setenv("PUSHPULL_METRICS", "127.0.0.1:0")
    p = run_job(pushpull, "metrics.py", tmp_path, seed, config=SMALL)
    assert p.returncode == 0, p.stderr
    addresses = set()
    for rank in range(2):
        got = json.loads((tmp_path / f"metrics-{rank}.json").read_text())
        own, s = got["own"], got["scraped"]
        addresses.add(got["address"])
        assert got["address"].startswith("127.0.0.1:"), got["address"]
        me = f'role="worker",rank="{rank}"'
        # Totals: the endpoint reads the same counters the worker keeps.
        assert s[f"pushpull_pushed_bytes_total{{{me}}}"] == own["bytes_pushed"] > 0
        assert s[f"pushpull_pulled_bytes_total{{{me}}}"] == own["bytes_pulled"] > 0
        # 4 broadcasts of the parameters, then 4 gradients a step.
        assert s[f"pushpull_rounds_total{{{me}}}"] == own["rounds"] == 4 + 4 * STEPS
        grads = {n: t for n, t in own["tensors"].items() if n.startswith("Gradient.")}
        assert len(grads) == 4, sorted(own["tensors"])
        for name, t in own["tensors"].items():
            label = f'{{{me},tensor="{name}"}}'
            want = STEPS if name in grads else 1
            assert s[f"pushpull_tensor_rounds_total{label}"] == t["rounds"] == want, name
            assert s[f"pushpull_tensor_pushed_bytes_total{label}"] == t["bytes_pushed"], name
            assert t["bytes_pushed"] > 0 or name not in grads, name
            ratio = s[f"pushpull_tensor_compression_ratio{label}"]
            if name == "Gradient.0.weight":
                assert ratio > 10, (name, ratio)  # onebit: about 32x
            else:
                assert ratio <= 1.0, (name, ratio)  # float32 (headers: slightly below 1)
    assert len(addresses) == 2, "each worker serves its own endpoint"
