"""`pushpull local --workers N -- COMMAND`: output prefixes, exit status, a failing rank stops
the job; and, without the launcher (the BytePS environment set by hand, as on several hosts),
a killed worker, one whose script raised, or one that shut down cleanly while the others
still push, makes the others raise naming it instead of hanging (also when its rounds were
left for later by an ordered step)."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import JOBS, run_job

SMALL = Path(__file__).resolve().parent / "small.toml"


def test_prefixes_and_the_first_failure_stops_the_job(pushpull):
    t0 = time.monotonic()
    p = run_job(pushpull, "exit.py", workers=2, servers=1)
    took = time.monotonic() - t0
    assert p.returncode == 3, (p.returncode, p.stderr)
    assert "[rank 0] hello from 0" in p.stdout and "[rank 1] hello from 1" in p.stdout
    assert "[rank 1] note from 1" in p.stderr
    assert "rank 1 exited with code 3" in p.stderr
    # Rank 0 sleeps for 120 s unless the launcher stops it.
    assert took < 60, took


def test_a_successful_job_exits_0(pushpull, tmp_path):
    script = tmp_path / "ok.py"
    script.write_text(
        "import pushpull.torch as bps, torch\n"
        "bps.init()\n"
        "print('sum', bps.push_pull(torch.ones(3), average=False, name='x').tolist())\n"
    )  # no shutdown(): it runs at exit
    p = subprocess.run([str(pushpull), "local", "--workers", "3", "--servers", "1", "--",
                        sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    for r in range(3):
        assert f"[rank {r}] sum [3.0, 3.0, 3.0]" in p.stdout


def test_job_flags_are_refused_with_a_command(pushpull):
    p = subprocess.run([str(pushpull), "local", "--compressor", "onebit", "--", "true"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "--compressor" in p.stderr, p.stderr


@pytest.mark.parametrize("how", ["kill", "raise", "finally", "ordered"])
def test_a_lost_worker_is_named_by_the_others(pushpull, tmp_path, how):
    certs = tmp_path / "certs"
    subprocess.run([str(pushpull), "certs", "--out", str(certs), "--servers", "1", "--workers", "2"],
                   check=True, capture_output=True)
    config = tmp_path / "cluster.toml"
    config.write_text(SMALL.read_text().replace("num_servers = 2", "num_servers = 1"))

    def node(name):
        return ["--config", str(config), "--ca", str(certs / name / "ca.pem"),
                "--cert", str(certs / name / f"{name}.pem"), "--key", str(certs / name / f"{name}.key")]

    procs = []
    try:
        sched = subprocess.Popen([str(pushpull), "scheduler", *node("scheduler")],
                                 stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        procs.append(sched)
        line = sched.stdout.readline()
        assert line.startswith("pushpull-scheduler listening on "), line
        addr = line.split()[-1]
        procs.append(subprocess.Popen([str(pushpull), "server", *node("server0"), "--scheduler", addr],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        host, port = addr.rsplit(":", 1)
        workers = []
        for r in range(2):
            w = f"worker{r}"
            env = dict(os.environ, DMLC_ROLE="worker", DMLC_PS_ROOT_URI=host, DMLC_PS_ROOT_PORT=port,
                       DMLC_NUM_WORKER="2", DMLC_NUM_SERVER="1", DMLC_WORKER_ID=str(r),
                       PUSHPULL_CONFIG=str(config), PUSHPULL_TLS_CA=str(certs / w / "ca.pem"),
                       PUSHPULL_TLS_CERT=str(certs / w / f"{w}.pem"),
                       PUSHPULL_TLS_KEY=str(certs / w / f"{w}.key"))
            workers.append(subprocess.Popen([sys.executable, str(JOBS / "lost.py"), how], env=env,
                                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        procs += workers
        t0 = time.monotonic()
        out, err = workers[0].communicate(timeout=60)
        took = time.monotonic() - t0
        print(out, err)
        assert workers[0].returncode == 0, err
        assert "lost: " in out and "worker 1" in out, out
        if how == "finally":
            assert "finished" in out, out
        if how == "raise":
            # Told at exit, with the exception: not found out by a missed heartbeat.
            assert "the training script of rank 1 failed" in out, out
        if how == "ordered":
            # step 1's failed rounds released its step; their error came with step 2.
            assert "lost: in backward 2: " in out, out
        assert took < 30, took
        assert workers[1].wait(timeout=10) == (-9 if how in ("kill", "ordered") else 1)
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_the_exit_hook_notes_any_uncaught_exception(monkeypatch):
    """The hook runs the previous one first (the traceback), and notes the exception for the
    exit's abort even when that hook fails and the exception cannot be printed."""
    from pushpull.torch import _state

    monkeypatch.setattr(_state, "uncaught", None)
    seen = []

    def previous(kind, value, tb):
        seen.append(kind)
        raise RuntimeError("the previous hook failed")

    class Unprintable(Exception):
        def __str__(self):
            raise KeyboardInterrupt

    hook = _state._noting_uncaught(previous)
    with pytest.raises(RuntimeError, match="previous hook failed"):
        hook(Unprintable, Unprintable(), None)
    assert seen == [Unprintable]
    assert _state.uncaught == "the script raised Unprintable: (its message could not be printed)"
