"""The parts of BytePS's and Horovod's APIs added for drop-in scripts (jobs/byteps_api.py) on 2
workers and 2 servers, against single-process references computed here: float32 rank-order
sums in numpy, exact integer sums, torch.cat for allgather, the Rust single-process reference
for a compressed tensor, and single-process training for DistributedOptimizer's
set_backward_passes_per_step and DistributedDataParallel."""

from pathlib import Path

import numpy as np
import torch

from conftest import rank_order_sum, run_job, same_bits
from pushpull import Reference

SMALL = Path(__file__).resolve().parent / "small.toml"
KW = {"byteps_compressor_type": "onebit", "byteps_ef_type": "vanilla"}
CASES = ["declare staleness", "declare again", "compression mismatch", "compression type",
         "version push_pull", "version push_pull_async", "version push_pull_inplace",
         "version push_pull_async_inplace", "staleness", "integer overflow",
         "integer compression", "adasum", "op and average", "process set",
         "process set barrier", "horovod error", "runtime error",
         "user compressor in the optimizer", "op with updates", "bad compression",
         "allgather shapes", "suspended",
         "resume workers", "resume servers", "suspended pending round",
         "suspended pending declare", "suspended prescale", "prescale wrong length", "passes"]
NP_INT = {torch.int8: np.int8, torch.uint8: np.uint8, torch.int16: np.int16,
          torch.int32: np.int32, torch.int64: np.int64}


def f16(x):
    return np.asarray(x, dtype=np.float32).astype(np.float16).astype(np.float32)


def accumulate_and_average(model, rank_batches, workers):
    """Each rank's gradients accumulated over its micro-batches, then averaged as the servers
    and workers do: the float32 sum in rank order, divided by the number of workers."""
    grads = []
    for batches in rank_batches:
        model.zero_grad()
        for x, y in batches:
            torch.nn.functional.cross_entropy(model(x), y).backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    for name, p in model.named_parameters():
        acc = grads[0][name].clone()
        for g in grads[1:]:
            acc += g[name]
        p.grad = acc / workers
    return {n: p.grad.clone() for n, p in model.named_parameters()}


def test_byteps_and_horovod_calls_match_the_references(pushpull, seed, tmp_path):
    p = run_job(pushpull, "byteps_api.py", tmp_path, seed, config=SMALL)
    assert p.returncode == 0, p.stderr
    for r in range(2):
        for case in CASES:
            assert f"[rank {r}] ok {case}:" in p.stdout, (r, case)
        assert f"[rank {r}] done" in p.stdout
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(2)]
    n = ranks[0]["size"]
    assert n == 2
    m = ranks[0]["metrics"]["tensors"]

    # push_pull_async: a new tensor holding the average (or sum); the input untouched.
    x = [s["pa_in"].numpy() for s in ranks]
    assert np.abs(x[0]).max() > 0
    for s in ranks:
        assert same_bits(s["pa_out"], rank_order_sum(x) / np.float32(n))
        assert same_bits(s["ps_out"], rank_order_sum(x))

    # declare(name, **kwargs): onebit with error feedback, as the Rust reference computes it.
    assert "onebit" in " ".join(m["kw"]["codecs"]), m["kw"]
    ref = Reference(n, ranks[0]["job_seed"], str(SMALL))
    ref.declare("kw", ranks[0]["kw_in"].numel(), KW)
    got = ref.push_pull("kw", [s["kw_in"].numpy().tobytes() for s in ranks], True)
    for s in ranks:
        assert same_bits(s["kw_out"], np.frombuffer(got[s["rank"]], dtype=np.float32)), s["rank"]

    # compression=Compression.fp16: each worker's values rounded to fp16, summed in float32 in
    # rank order, the sum rounded to fp16 for the pull, then averaged.
    y = [s["f16_in"].numpy() for s in ranks]
    want = f16(rank_order_sum([f16(v) for v in y]))
    assert not same_bits(want, rank_order_sum(y))  # the compressor did change the bits
    for s in ranks:
        assert same_bits(s["f16_out"], want)
        assert same_bits(s["f16avg_out"], want / np.float32(n))
    assert m["f16c"]["bytes_pushed"] == m["f16c"]["raw_bytes"] // 2, m["f16c"]
    assert m["f16c"]["codecs"] == ["fp16"] * len(m["f16c"]["codecs"])

    # Integers: exact sums wrapped to the dtype, averages floor-divided, broadcast exact.
    for k, t in ranks[0]["int_in"].items():
        exact = sum(s["int_in"][k].numpy().astype(np.int64) for s in ranks)
        for s in ranks:
            assert s["int_sum"][k].dtype == t.dtype
            assert np.array_equal(s["int_sum"][k].numpy(), exact.astype(NP_INT[t.dtype])), k
            avg = np.floor_divide(exact, n).astype(NP_INT[t.dtype])
            assert np.array_equal(s["int_avg"][k].numpy(), avg), k
    i8 = sum(s["int_in"]["i8"].numpy().astype(np.int64) for s in ranks)
    assert (i8 > 127).any() or (i8 < -128).any()  # the wrap was exercised
    assert (i8 % n != 0).any() and (i8 < 0).any()  # and the floor of negative halves
    for s in ranks:
        assert torch.equal(s["bint_out"], ranks[1]["bint_in"])
    assert not torch.equal(ranks[0]["bint_in"], ranks[1]["bint_in"])

    # broadcast's autograd: the root's values everywhere; the gradient averaged, at the root.
    wavg = rank_order_sum([s["bgrad"]["w"].numpy() for s in ranks]) / np.float32(n)
    for s in ranks:
        assert torch.equal(s["bgrad"]["y"], ranks[1]["bgrad"]["x"])
        if s["rank"] == 1:
            assert same_bits(s["bgrad"]["grad"], wavg)
        else:
            assert not s["bgrad"]["grad"].any()

    # Horovod's allreduce family.
    h = [s["hvd_in"].numpy() for s in ranks]
    hsum = rank_order_sum(h)
    for s in ranks:
        assert same_bits(s["hvd_avg"], hsum / np.float32(n))
        assert same_bits(s["hvd_avg_old"], hsum / np.float32(n))
        assert same_bits(s["hvd_sum"], hsum)
        assert same_bits(s["hvd_min"], np.minimum.reduce(h))
        assert same_bits(s["hvd_max"], np.maximum.reduce(h))
        want = h[0][:64].copy()
        for x in h[1:]:
            want = want * x[:64]  # float32, in rank order as torch.prod
        assert np.allclose(s["hvd_prod"].numpy(), want, rtol=1e-6, atol=0)
        ints = [t["hvd_ints_in"].numpy() for t in ranks]
        assert np.array_equal(s["hvd_imax"][0].numpy(), np.maximum.reduce(ints))
        assert np.array_equal(s["hvd_imax"][1].numpy(), np.maximum.reduce(ints)[0])
        assert np.array_equal(s["hvd_iprod"].numpy(), np.prod(np.stack(ints), axis=0))
        assert same_bits(s["hvd_inplace"], hsum)
        assert same_bits(s["hvd_async"], hsum / np.float32(n))
        assert same_bits(s["hvd_async_"], hsum * np.float32(0.5))
        assert same_bits(s["hvd_ps"], hsum)
        assert same_bits(s["hvd_ps_all"], hsum)
        assert same_bits(s["hvd_grouped"][0], hsum)
        assert same_bits(s["hvd_grouped"][1], rank_order_sum([x[:100] * np.float32(3) for x in h]))
        assert same_bits(s["hvd_grouped_"][0], hsum * np.float32(0.5))
        assert torch.equal(s["bcast_async"], ranks[1]["bcast_async_in"])
        assert s["objects"] == [{"rank": q, "pad": "x" * (7 * q + 1)} for q in range(n)]
    # The user's compressor: fp16 of twice each value, summed in float32, narrowed to the
    # fp16 tensor compress gave, halved back to float32.
    sent = [(s["user_in"].numpy() * np.float32(2)).astype(np.float16).astype(np.float32)
            for s in ranks]
    user = rank_order_sum(sent).astype(np.float16).astype(np.float32) / np.float32(2)
    # DistributedOptimizer: op=Sum sums; a predivide factor f sums g / f, times f / n.
    for i in range(2):
        opsum = rank_order_sum([s["opsum_in"][i].numpy() for s in ranks])
        pre = rank_order_sum([s["predivide_in"][i].numpy() * np.float32(1 / 3) for s in ranks])
        for s in ranks:
            assert same_bits(s["opsum_out"][i], opsum)
            assert same_bits(s["predivide_out"][i], pre * np.float32(3 / n))
            # Not the plain average: the factor's roundings show in the bits.
            plain = rank_order_sum([q["predivide_in"][i].numpy() for q in ranks]) / np.float32(n)
            assert not same_bits(s["predivide_out"][i], plain)
    for s in ranks:
        assert same_bits(s["user_out"], user)
        assert same_bits(s["user_inplace"], user)

    # allgather: torch.cat of every rank's tensor, bit for bit (-0.0 included).
    def cat(key):
        return torch.cat([s[key].reshape(-1, *s[key].shape[1:]) if s[key].dim() else
                          s[key].reshape(1) for s in ranks])

    for s in ranks:
        want = cat("ag_in")
        assert s["ag_out"].shape == (3 + 5, 4)
        assert torch.equal(s["ag_out"].view(torch.int32), want.view(torch.int32))
        assert torch.equal(s["ag_int_out"], cat("ag_int_in"))
        assert s["ag_int_out"].dtype == torch.int64
        assert s["ag_f64_out"].dtype == torch.float64
        assert torch.equal(s["ag_f64_out"], cat("ag_f64_in").to(torch.float32).to(torch.float64))
        assert torch.equal(s["ag_scalar_out"], cat("ag_scalar_in"))
    assert torch.signbit(ranks[0]["ag_out"][0, 0]) and torch.signbit(ranks[0]["ag_out"][3, 0])

    # push_pull's autograd: forward the sum, backward the sum of the gradients.
    for s in ranks:
        assert same_bits(s["autograd"]["y"], rank_order_sum([t["autograd"]["x"].numpy() for t in ranks]))
        assert same_bits(s["autograd"]["grad"], rank_order_sum([t["autograd"]["w"].numpy() for t in ranks]))

    # prefix: the broadcast tensors' declared names.
    for s in ranks:
        for k, v in ranks[1]["prefix_in"].items():
            assert torch.equal(s["prefix_out"][k], v), k
        assert s["opt_lr"] == 1.1
    assert {"Custom.weight", "Custom.bias", "Custom.optimizer_state.length"} <= set(m), sorted(m)

    # resume with the job's own sizes: rounds again.
    for s in ranks:
        assert torch.equal(s["after_resume"], torch.full((100,), 3.0))
        assert s["join"] == ranks[0]["join"] and 0 <= s["join"] < n

    # declare(name, **kwargs) refused while suspended: the map kept, used after resume.
    for s in ranks:
        assert s["kws_params"] == {"kw.suspended": KW, "kw.suspended2": KW}, s["kws_params"]
    for k in ("kw.suspended", "kw.suspended2"):
        assert "onebit" in " ".join(m[k]["codecs"]), m[k]
    ref.declare("kw.suspended", ranks[0]["kws_in"].numel(), KW)
    got = ref.push_pull("kw.suspended", [s["kws_in"].numpy().tobytes() for s in ranks], True)
    for s in ranks:
        want = np.frombuffer(got[s["rank"]], dtype=np.float32)
        assert same_bits(s["kws_out"], want), s["rank"]

    # allreduce_async_ on float16: prescaled after widening (one float32 product per element),
    # summed in rank order, postscaled in float32, then rounded to float16 once.
    p32, q32 = np.float32(0.1), np.float32(0.5)
    h16 = [s["hvd16_in"].numpy().astype(np.float32) for s in ranks]
    want = (rank_order_sum([v * p32 for v in h16]) * q32).astype(np.float16)
    for s in ranks:
        assert s["hvd16_out"].dtype == torch.float16
        assert np.array_equal(s["hvd16_out"].numpy().view(np.uint16), want.view(np.uint16)), s["rank"]
    # Scaling in float16 first (what the call did before) would round differently.
    old = (rank_order_sum([f16(v * p32) for v in h16]) * q32).astype(np.float16)
    assert not np.array_equal(old.view(np.uint16), want.view(np.uint16))

    # set_backward_passes_per_step: 1, 2 and 2 accumulated passes per step (one thread, as
    # the workers: the bits of a matmul depend on the threads).
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    model.load_state_dict(ranks[0]["bp_init"])
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(3):
        accumulate_and_average(model, [s["bp_batches"][step] for s in ranks], n)
        opt.step()
    for s in ranks:
        for k, v in model.state_dict().items():
            assert torch.equal(s["bp_out"][k], v), (s["rank"], k)

    # DistributedDataParallel: rank 0's state at construction, then the averaged gradients.
    for s in ranks:
        for k, v in ranks[0]["ddp_init_in"].items():
            assert torch.equal(s["ddp_init_out"][k], v), k
    assert not torch.equal(ranks[0]["ddp_init_in"]["0.weight"], ranks[1]["ddp_init_in"]["0.weight"])
    net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16), torch.nn.ReLU(),
                              torch.nn.Linear(16, 3))
    net.load_state_dict(ranks[0]["ddp_init_in"])
    sgd = torch.optim.SGD(net.parameters(), lr=0.05)
    for step in range(3):
        grads = accumulate_and_average(net, [s["ddp_batches"][step] for s in ranks], n)
        for s in ranks:
            for k, g in grads.items():
                assert torch.equal(s["ddp_grads"][step][k], g), (s["rank"], step, k)
        sgd.step()
    for s in ranks:
        for k, v in net.named_parameters():
            assert torch.equal(s["ddp_out"][k], v.detach()), (s["rank"], k)
        # broadcast_buffers: the forward in eval mode used (and kept) rank 0's buffers.
        assert torch.equal(s["ddp_bn_after"], ranks[0]["ddp_bn_before"])
    assert not torch.equal(ranks[1]["ddp_bn_before"], ranks[0]["ddp_bn_before"])
