"""A Horovod script with its import changed: python/examples/horovod_digits.py (the structure of
Horovod's examples/pytorch/pytorch_mnist.py on scikit-learn's digits) trains on 2 workers with
float32 or fp16 gradients, Horovod's gradient_predivide_factor and its synchronize-first loop,
and op=Adasum is refused naming what pushpull supports."""

import re

import pytest

from conftest import run_job

SCRIPT = "../../examples/horovod_digits.py"


def accuracies(stdout: str):
    return [float(a) for a in re.findall(r"Accuracy: ([0-9.]+)%", stdout)]


@pytest.mark.parametrize("args", [
    [],
    ["--fp16-allreduce", "--gradient-predivide-factor", "2", "--synchronize-first"],
])
def test_a_horovod_script_trains_with_its_import_changed(pushpull, args):
    p = run_job(pushpull, SCRIPT, *args, timeout=300)
    assert p.returncode == 0, p.stderr
    acc = accuracies(p.stdout)
    # Rank 0 prints the averaged test metrics after each of the 10 epochs; the digits reach
    # over 85 % (a model that learnt nothing gets about 10 %).
    assert len(acc) == 10, p.stdout
    assert acc[-1] > 85.0 and acc[-1] > acc[0], acc


def test_adasum_is_refused_naming_the_ops_pushpull_has(pushpull):
    p = run_job(pushpull, SCRIPT, "--use-adasum", "--epochs", "1", timeout=120)
    assert p.returncode != 0
    assert "Adasum" in p.stderr and "Average" in p.stderr, p.stderr


def test_horovods_build_queries_answer_and_its_timeline_calls_say_what_to_use():
    import torch

    import pushpull.torch as hvd

    for name in ("mpi_built", "gloo_built", "nccl_built", "ddl_built", "ccl_built", "rocm_built",
                 "mpi_enabled", "gloo_enabled", "mpi_threads_supported"):
        assert getattr(hvd, name)() is False, name
    assert hvd.cuda_built() == torch.cuda.is_available()
    with pytest.raises(ValueError, match="trace.dir"):
        hvd.start_timeline("/tmp/timeline.json")
    with pytest.raises(ValueError, match="PUSHPULL_TRACE"):
        hvd.stop_timeline()
