"""Bad calls raise Python exceptions naming the tensor and the key or value; the job goes on."""

from pathlib import Path

from conftest import run_job

SMALL = Path(__file__).resolve().parent / "small.toml"

CASES = ["dtype", "length", "undeclared", "handle", "bad map", "map types", "mismatch",
         "priority", "nesterov", "optimizer staleness", "warmup compression", "warmup unused",
         "init after shutdown"]


def test_bad_calls_raise_named_errors(pushpull):
    p = run_job(pushpull, "errors.py", config=SMALL)
    assert p.returncode == 0, p.stderr
    for r in range(2):
        for case in CASES:
            assert f"[rank {r}] ok {case}:" in p.stdout, (r, case)
        assert f"[rank {r}] done" in p.stdout
