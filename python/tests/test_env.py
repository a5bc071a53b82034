"""How a worker reads its job from the cluster file and BytePS's environment."""

import pytest

from pushpull import join_settings


def test_rank_formula_and_overrides():
    env = {"DMLC_ROLE": "worker", "DMLC_PS_ROOT_URI": "10.0.0.1", "DMLC_PS_ROOT_PORT": "9000",
           "DMLC_NUM_WORKER": "3", "DMLC_NUM_SERVER": "2", "DMLC_WORKER_ID": "2",
           "BYTEPS_LOCAL_RANK": "1", "BYTEPS_LOCAL_SIZE": "4", "PUSHPULL_CONFIG": "/c.toml",
           "PUSHPULL_TLS_CA": "/ca.pem", "PUSHPULL_TLS_CERT": "/w.pem", "PUSHPULL_TLS_KEY": "/w.key"}
    s = join_settings(env=env)
    assert s.scheduler == "10.0.0.1:9000"
    assert (s.num_workers, s.num_servers, s.rank) == (12, 2, 2 * 4 + 1)
    assert (s.local_rank, s.local_size) == (1, 4)
    assert (s.tls_ca, s.tls_cert, s.tls_key) == ("/ca.pem", "/w.pem", "/w.key")
    assert s.config == "/c.toml"
    # The argument beats PUSHPULL_CONFIG.
    assert join_settings("/mine.toml", env=env).config == "/mine.toml"


def test_file_alone_keeps_its_values():
    s = join_settings(env={"PUSHPULL_CONFIG": "/c.toml"})
    assert (s.scheduler, s.num_workers, s.num_servers, s.rank) == (None, None, None, None)
    assert s.worker_kwargs()["config"] == "/c.toml"


def test_torchrun_variables_stand_in_for_byteps():
    env = {"MASTER_ADDR": "node001", "MASTER_PORT": "29500", "WORLD_SIZE": "8", "RANK": "6",
           "LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "4", "PUSHPULL_CONFIG": "/c.toml"}
    s = join_settings(env=env)
    assert s.scheduler == "node001:29500"
    assert (s.num_workers, s.rank, s.local_rank, s.local_size) == (8, 6, 2, 4)
    # Without LOCAL_WORLD_SIZE every process is its own host.
    s = join_settings(env={"MASTER_ADDR": "h", "MASTER_PORT": "1", "WORLD_SIZE": "3", "RANK": "2"})
    assert (s.num_workers, s.rank, s.local_size) == (3, 2, 1)
    # Agreeing pairs are fine; disagreeing ones are named.
    same = dict(env, DMLC_PS_ROOT_URI="node001", DMLC_NUM_WORKER="2", DMLC_WORKER_ID="1")
    assert join_settings(env=same).rank == 6
    for extra, words in [
        ({"DMLC_PS_ROOT_PORT": "9000"}, ["DMLC_PS_ROOT_PORT='9000'", "MASTER_PORT='29500'"]),
        ({"DMLC_NUM_WORKER": "3"}, ["DMLC_NUM_WORKER", "WORLD_SIZE=8"]),
        ({"DMLC_WORKER_ID": "0"}, ["DMLC_WORKER_ID", "RANK=6"]),
        ({"WORLD_SIZE": "6"}, ["WORLD_SIZE=6", "LOCAL_WORLD_SIZE=4"]),
        ({"RANK": "5"}, ["RANK=5", "LOCAL_RANK"]),
        ({"RANK": "x"}, ["RANK", "'x'"]),
    ]:
        with pytest.raises(ValueError) as e:
            join_settings(env=dict(env, **extra))
        for w in words:
            assert w in str(e.value), (extra, str(e.value))


def test_ipv6_scheduler():
    s = join_settings(env={"DMLC_PS_ROOT_URI": "fd00::1", "DMLC_PS_ROOT_PORT": "9000"})
    assert s.scheduler == "[fd00::1]:9000"


@pytest.mark.parametrize("env,words", [
    ({}, ["PUSHPULL_CONFIG", "DMLC_PS_ROOT_URI"]),
    ({"DMLC_ROLE": "server", "PUSHPULL_CONFIG": "/c"}, ["DMLC_ROLE", "pushpull-server"]),
    ({"DMLC_PS_ROOT_URI": "h"}, ["DMLC_PS_ROOT_PORT"]),
    ({"DMLC_PS_ROOT_URI": "h", "DMLC_PS_ROOT_PORT": "x"}, ["DMLC_PS_ROOT_PORT", "'x'"]),
    ({"PUSHPULL_CONFIG": "/c", "BYTEPS_LOCAL_RANK": "2", "BYTEPS_LOCAL_SIZE": "2"},
     ["BYTEPS_LOCAL_RANK=2", "BYTEPS_LOCAL_SIZE=2"]),
    ({"PUSHPULL_CONFIG": "/c", "DMLC_NUM_WORKER": "2", "DMLC_WORKER_ID": "2"}, ["DMLC_WORKER_ID=2"]),
    ({"PUSHPULL_CONFIG": "/c", "DMLC_NUM_WORKER": "0"}, ["DMLC_NUM_WORKER", ">= 1"]),
])
def test_bad_settings_name_the_variable(env, words):
    with pytest.raises(ValueError) as e:
        join_settings(env=env)
    for w in words:
        assert w in str(e.value)


def test_bad_files_are_named(tmp_path):
    import pushpull
    with pytest.raises(pushpull.PushPullError, match="nope.toml"):
        pushpull.Worker(str(tmp_path / "nope.toml"))
    bad = tmp_path / "bad.toml"
    bad.write_text("[cluster]\nnum_wokers = 2\n")
    with pytest.raises(pushpull.PushPullError, match="num_wokers"):
        pushpull.Worker(str(bad))


def test_byteps_variables_without_an_equivalent_are_refused(tmp_path, monkeypatch):
    import pushpull
    good = tmp_path / "good.toml"
    good.write_text('[cluster]\nscheduler = "127.0.0.1:9"\nnum_workers = 1\nnum_servers = 1\n')
    monkeypatch.setenv("BYTEPS_NCCL_GROUP_SIZE", "4")
    with pytest.raises(pushpull.PushPullError, match="BYTEPS_NCCL_GROUP_SIZE.*NCCL"):
        pushpull.Worker(str(good))
    monkeypatch.delenv("BYTEPS_NCCL_GROUP_SIZE")
    monkeypatch.setenv("BYTEPS_PARTITION_BYTES", "6")
    with pytest.raises(pushpull.PushPullError, match="BYTEPS_PARTITION_BYTES.*multiple of 4"):
        pushpull.Worker(str(good))
