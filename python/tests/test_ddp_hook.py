"""pushpull.torch.push_pull_hook in torch's own DistributedDataParallel (jobs/ddp_hook.py) on 2
workers and 2 servers: uncompressed, bit-identical to DDP's own all-reduce step by step; with
onebit and error feedback, every bucket round bit-identical to the Rust single-process
reference carrying the compressor state across the steps, fewer bytes pushed, a training
loss that decreases; DDP's bucket rebuild giving new names; a hook that does not wait for the
round."""

from collections import defaultdict
from pathlib import Path

import numpy as np
import torch

from conftest import rank_order_sum, run_job, same_bits
from pushpull import Reference

SMALL = Path(__file__).resolve().parent / "small.toml"
STEPS, ONEBIT_STEPS = 4, 15


def test_ddp_hook_matches_ddp_and_the_reference(pushpull, seed, tmp_path):
    p = run_job(pushpull, "ddp_hook.py", tmp_path, seed, config=SMALL)
    assert p.returncode == 0, p.stderr
    for r in range(2):
        assert f"[rank {r}] done" in p.stdout
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(2)]
    n = ranks[0]["size"]
    assert n == 2

    # Uncompressed: DDP's own all-reduce (each gradient times 1/2, summed) and the hook's
    # (the sum, divided by 2) are the same bits with 2 workers, at every step.
    for s in ranks:
        assert len(s["plain"]) == len(s["hooked"]) == STEPS
        for step, (want, got) in enumerate(zip(s["plain"], s["hooked"])):
            for k in want:
                assert same_bits(got[k], want[k]), (s["rank"], step, k)
                assert same_bits(got[k], ranks[0]["hooked"][step][k]), (s["rank"], step, k)
    assert not torch.equal(ranks[0]["plain"][0]["0.weight"], ranks[0]["plain"][1]["0.weight"])

    # DDP rebuilds its buckets after the first step (one bucket of every parameter, then
    # buckets of bucket_cap_mb): the rebuilt ones have new names, used from then on.
    m = ranks[0]["metrics"]["tensors"]
    names = ranks[0]["hooked_names"]
    assert names == ranks[1]["hooked_names"]
    total = sum(v.numel() for v in ranks[0]["plain"][0].values())
    assert len(names) >= 3 and names[0].startswith(f"DDP.0.bucket.0.{total}."), names
    assert m[names[0]]["rounds"] == 1
    for name in names[1:]:
        assert m[name]["rounds"] == STEPS - 1, (name, m[name])
        assert m[name]["codecs"] == ["none"] * len(m[name]["codecs"]), m[name]
    assert sum(m[name]["len"] for name in names[1:]) == total

    # onebit with error feedback: each bucket's rounds are the Rust reference's, which carries
    # the compressor state of a tensor from round to round (so does the cluster, per name).
    onebit = ranks[0]["onebit_names"]
    assert onebit == ranks[1]["onebit_names"] and len(onebit) >= 3
    by_name = [defaultdict(list) for _ in ranks]
    for s, rounds in zip(ranks, by_name):
        for name, x, y in s["onebit_rounds"]:
            rounds[name].append((x, y))
    ref = Reference(n, ranks[0]["job_seed"], str(SMALL))
    for name in onebit:
        assert len(by_name[0][name]) == len(by_name[1][name]) == m[name]["rounds"]
        ref.declare(name, m[name]["len"], ranks[0]["onebit_map"])
        for k in range(m[name]["rounds"]):
            got = ref.push_pull(name, [rounds[name][k][0].numpy().tobytes() for rounds in by_name],
                                True)
            for s, rounds in zip(ranks, by_name):
                want = np.frombuffer(got[s["rank"]], dtype=np.float32)
                assert same_bits(rounds[name][k][1], want), (name, k, s["rank"])
        assert "onebit" in " ".join(m[name]["codecs"]), m[name]
        # Each float32 is a sign bit (plus a scale per chunk).
        assert m[name]["bytes_pushed"] * 10 < m[name]["raw_bytes"], m[name]
    for name in onebit[1:]:
        assert m[name]["rounds"] == ONEBIT_STEPS - 1 > 1, m[name]
    for s in ranks:
        # The compressed training differs from its uncompressed twin, and learns.
        assert any(not torch.equal(s["onebit_params"][k], s["twin_params"][k])
                   for k in s["twin_params"])
        losses = s["onebit_loss"]
        assert s["onebit_final_loss"] < losses[0] - 0.05 and losses[-1] < losses[0], losses

    # The hook returns before the round ends (rank 1 pushed a second later), and its future
    # then holds the average.
    assert ranks[0]["late_call_s"] < 0.5 and not ranks[0]["late_done_at_return"], ranks[0]["late_call_s"]
    # torch's fp16 wrapper: the inputs rounded to fp16, summed in float32 on the servers, the
    # sum sent back as fp16, averaged and narrowed to the wrapper's float16 buffer.
    f16 = [s["half_in"].numpy().astype(np.float16).astype(np.float32) for s in ranks]
    half_sum = rank_order_sum(f16).astype(np.float16).astype(np.float32)
    want_half = (half_sum / np.float32(n)).astype(np.float16)
    for s in ranks:
        assert s["half_out"].dtype == torch.float16
        assert np.array_equal(s["half_out"].numpy().view(np.uint16), want_half.view(np.uint16))
        t = s["metrics"]["tensors"][s["half_names"][0]]
        assert "fp16" in " ".join(t["codecs"]), t
        assert t["bytes_pushed"] * 2 <= t["raw_bytes"], t
    # A skipped step (bucket 1 not finite on rank 0) is discarded: the next step is the fresh
    # state's, bit for bit, and not the one whose first step was kept.
    for s in ranks:
        assert torch.isnan(s["skipped_first"][1]).any() and torch.isfinite(s["skipped_first"][0]).all()
        for got, fresh, kept in zip(s["skipped_second"], s["fresh_second"], s["kept_second"]):
            assert torch.equal(got.view(torch.int32), fresh.view(torch.int32))
        assert not torch.equal(s["kept_second"][0], s["fresh_second"][0])
    # PowerSGD: each bucket is one tensor declared with its gradients' shapes (`pieces`, each
    # shape[0] x the rest, a vector as its length); every round is the Rust reference's bit
    # for bit, and the buckets with matrices pushed fewer bytes.
    def pieces(shapes):
        return ",".join(f"{s[0]}x{int(np.prod(s)) // s[0]}" if len(s) > 1 else str(int(np.prod(s)))
                        for s in shapes)

    ref = Reference(n, ranks[0]["job_seed"], str(SMALL))
    declared = set()
    per_rank = [defaultdict(list) for _ in ranks]
    for s, rounds in zip(ranks, per_rank):
        for name, shapes, x, y in s["powersgd_rounds"]:
            rounds[name].append((shapes, x, y))
    assert per_rank[0].keys() == per_rank[1].keys()
    compressed = 0
    for name in per_rank[0]:
        for k, (shapes, x, _) in enumerate(per_rank[0][name]):
            if name not in declared:
                declared.add(name)
                ref.declare(name, x.numel(), {**ranks[0]["powersgd_map"], "pieces": pieces(shapes)})
            got = ref.push_pull(name, [rounds[name][k][1].numpy().tobytes() for rounds in per_rank],
                                True)
            for s, rounds in zip(ranks, per_rank):
                want = np.frombuffer(got[s["rank"]], dtype=np.float32)
                assert same_bits(rounds[name][k][2], want), (name, k, s["rank"])
    for tname in declared:
        t = m[tname]
        # The rebuilt buckets (the first ones ran one step, before start_iter): their weights
        # are compressed, their biases ride in the P rounds.
        if t["rounds"] > 2:
            compressed += 1
            assert "powersgd" in " ".join(t["codecs"]), t
            assert t["bytes_pushed"] * 2 < t["raw_bytes"], (tname, t)
    assert compressed >= 1, sorted(declared)
    assert sorted(declared) == sorted(ranks[0]["powersgd_names"])
    for s in ranks:
        losses = s["powersgd_loss"]
        assert losses[-1] < losses[0] - 0.05, losses
    world = rank_order_sum([s["world_in"].numpy() for s in ranks]) / np.float32(n)
    for s in ranks:
        assert same_bits(s["world_out"], world), s["rank"]
    want = rank_order_sum([s["late_in"].numpy() for s in ranks]) / np.float32(n)
    for s in ranks:
        assert same_bits(s["late_out"], want), s["rank"]
