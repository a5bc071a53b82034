"""DistributedOptimizer on 2 workers gives exactly the parameters of a single-process run that
averages the same gradients: in float32, rank order, uncompressed; through the Rust
single-process reference with a compressor; with a loss scaler whose step overflows on one
worker (mixed precision), skipped on every worker and discarded in the reference."""

from pathlib import Path

import pytest
import torch

from conftest import check_fusion_job, run_job
from optimizer_common import (
    AMP_SCALE, MAPS, PASSES, STEPS, WARMUP, WARMUP_COMPRESSION, WORKERS, batch, lr_at,
    make_model, make_optimizer, overflow,
)
from pushpull import Reference

SMALL = Path(__file__).resolve().parent / "small.toml"


def tensors_of(model: torch.nn.Module, mode: str, cap: float):
    """The tensors DistributedOptimizer declares, in its order, each with its map and the
    parameter names it holds: one per parameter, but with PowerSGD one per bucket of two or
    more (DDP's buckets: the parameters in reverse order, closing once ``cap`` MiB are
    held), declared with its gradients' shapes (``pieces``) at its first parameter."""
    named = list(model.named_parameters())
    m = MAPS[mode]
    if m is None or m["byteps_compressor_type"] != "powersgd":
        return [(f"Gradient.{n}", m, [n]) for n, _ in named]
    buckets, current, held = [], [], 0
    for k in reversed(range(len(named))):
        if current and held >= cap * 2**20:
            buckets.append(current)
            current, held = [], 0
        current.append(k)
        held += 4 * named[k][1].numel()
    buckets.append(current)
    out = []
    for b in sorted(sorted(b) for b in buckets):
        names = [named[k][0] for k in b]
        shapes = [named[k][1].shape for k in b]
        if len(b) == 1:
            out.append((f"Gradient.{names[0]}", {**m, "rows": str(shapes[0][0])}, names))
            continue
        pieces = ",".join(f"{s[0]}x{s.numel() // s[0]}" if len(s) > 1 else str(s.numel())
                          for s in shapes)
        out.append((f"Gradient.powersgd[{names[0]}..{names[-1]}]", {**m, "pieces": pieces}, names))
    return out


def single_process(seed: int, mode: str, job_seed: int, cap: float):
    """The final parameters and the loss scaler's final scale (None without one)."""
    torch.set_num_threads(1)
    model = make_model(seed)  # rank 0's initialisation, which the broadcast gives everyone
    if mode == "updates":
        return single_process_updates(seed, mode, job_seed, model), None
    if mode.startswith("momentum"):
        return single_process_momentum(seed, mode, job_seed, model), None
    opt = make_optimizer(mode, model.parameters())
    scaler = torch.amp.GradScaler("cpu", init_scale=AMP_SCALE) if mode == "amp" else None
    ref = None
    params = dict(model.named_parameters())
    tensors = tensors_of(model, mode, cap)
    if MAPS[mode] is not None:
        ref = Reference(WORKERS, job_seed, str(SMALL))
        for tname, m, names in tensors:
            ref.declare(tname, sum(params[n].numel() for n in names), m)
    for step in range(STEPS):
        for group in opt.param_groups:
            group["lr"] = lr_at(step)
        if ref is not None:
            ref.set_learning_rate(lr_at(step))
        grads = []
        for r in range(WORKERS):
            model.zero_grad()
            hook = overflow(model, mode, step, r)
            for micro in range(PASSES.get(mode, 1)):
                x, y = batch(seed, step, r, micro)
                loss = torch.nn.functional.cross_entropy(model(x), y)
                (scaler.scale(loss) if scaler else loss).backward()
            if hook:
                hook.remove()
            grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
        if ref is None:
            for name, p in model.named_parameters():
                acc = grads[0][name].clone()
                for g in grads[1:]:
                    acc += g[name]
                p.grad = acc / WORKERS
        for tname, _, names in tensors if ref is not None else []:
            inputs = [torch.cat([g[n].reshape(-1) for n in names]).numpy().tobytes()
                      for g in grads]
            got = torch.frombuffer(bytearray(ref.push_pull(tname, inputs, True)[0]),
                                   dtype=torch.float32)
            for n, piece in zip(names, got.split([params[n].numel() for n in names])):
                params[n].grad = piece.view_as(params[n])
        if scaler is None:
            opt.step()
            continue
        # An overflow anywhere: the scaler skips the step, whose rounds are discarded.
        if not all(torch.isfinite(p.grad).all() for p in model.parameters()):
            for tname, _, _ in tensors:
                ref.discard_last_round(tname)
        scaler.step(opt)
        scaler.update()
    return model.state_dict(), scaler.get_scale() if scaler else None


def single_process_updates(seed: int, mode: str, job_seed: int, model: torch.nn.Module):
    """average="updates": each worker's own optimizer (a copy of the model whose parameters
    are reset to the shared ones before its step) steps on its own gradients; the changes
    are averaged through the reference and added to the shared parameters."""
    import copy

    ref = Reference(WORKERS, job_seed, str(SMALL))
    for name, p in model.named_parameters():
        ref.declare(f"Gradient.{name}", p.numel(), MAPS[mode])
    copies = [copy.deepcopy(model) for _ in range(WORKERS)]
    opts = [make_optimizer(mode, c.parameters()) for c in copies]
    for step in range(STEPS):
        deltas = []
        for r, (c, opt) in enumerate(zip(copies, opts)):
            with torch.no_grad():
                for q, p in zip(c.parameters(), model.parameters()):
                    q.copy_(p)
            for group in opt.param_groups:
                group["lr"] = lr_at(step)
            opt.zero_grad()
            x, y = batch(seed, step, r)
            torch.nn.functional.cross_entropy(c(x), y).backward()
            opt.step()
            deltas.append({n: (q.detach() - p.detach()) for (n, q), p
                           in zip(c.named_parameters(), model.parameters())})
        with torch.no_grad():
            for name, p in model.named_parameters():
                got = ref.push_pull(f"Gradient.{name}",
                                    [d[name].numpy().tobytes() for d in deltas], True)
                p.add_(torch.frombuffer(bytearray(got[0]), dtype=torch.float32).view_as(p))
    return model.state_dict()


def single_process_momentum(seed: int, mode: str, job_seed: int, model: torch.nn.Module):
    """average="momentum" with AdamW: WARMUP steps of AdamW on the float32 rank-order average
    of the gradients (through the reference with the fp16 map where WARMUP_COMPRESSION says
    so: a plain tensor stays float32 there too); then, with v = exp_avg_sq / (1 - beta2^WARMUP)
    frozen, every step averages each worker's beta1 * m + (1 - beta1) * g through the
    reference and steps
    p <- p (1 - lr wd) - lr / (1 - beta1^t) * m / (sqrt(v) + eps)."""
    ref = Reference(WORKERS, job_seed, str(SMALL))
    warmup_map = {"byteps_compressor_type": WARMUP_COMPRESSION.get(mode, "none")}
    for name, p in model.named_parameters():
        ref.declare(f"Gradient.{name}", p.numel(), MAPS[mode])
        ref.declare(f"Gradient.{name}@warmup", p.numel(), warmup_map)
    opt = make_optimizer(mode, model.parameters())
    (b1, b2), eps, wd = opt.defaults["betas"], opt.defaults["eps"], opt.defaults["weight_decay"]
    named = list(model.named_parameters())
    v = m = None
    for step in range(STEPS):
        lr = lr_at(step)
        grads = []
        for r in range(WORKERS):
            model.zero_grad()
            x, y = batch(seed, step, r)
            torch.nn.functional.cross_entropy(model(x), y).backward()
            grads.append({n: p.grad.clone() for n, p in named})
        if step < WARMUP:
            for name, p in named:
                if mode in WARMUP_COMPRESSION:
                    got = ref.push_pull(f"Gradient.{name}@warmup",
                                        [g[name].numpy().tobytes() for g in grads], True)
                    p.grad = torch.frombuffer(bytearray(got[0]), dtype=torch.float32).view_as(p)
                else:
                    acc = grads[0][name].clone()
                    for g in grads[1:]:
                        acc += g[name]
                    p.grad = acc / WORKERS
            for group in opt.param_groups:
                group["lr"] = lr
            opt.step()
            continue
        if v is None:
            v = {n: opt.state[p]["exp_avg_sq"] / (1 - b2 ** WARMUP) for n, p in named}
            m = {n: opt.state[p]["exp_avg"].clone() for n, p in named}
        t = step + 1
        with torch.no_grad():
            for name, p in named:
                local = [g[name].mul(1 - b1).add(m[name], alpha=b1) for g in grads]
                got = ref.push_pull(f"Gradient.{name}", [x.numpy().tobytes() for x in local], True)
                m[name] = torch.frombuffer(bytearray(got[0]), dtype=torch.float32).view_as(p)
                p.mul_(1 - lr * wd)
                p.addcdiv_(m[name], v[name].sqrt().add(eps), value=-lr / (1 - b1 ** t))
    return model.state_dict()


def train_and_compare(pushpull, seed, tmp_path, mode, cap, *extra):
    """Runs jobs/optimizer.py (MODE, bucket cap, EXTRA) on WORKERS workers and checks every
    rank's final parameters against the single-process run; returns what each rank saved and
    the single-process run's final loss scale."""
    p = run_job(pushpull, "optimizer.py", tmp_path, seed, mode, cap, *extra, workers=WORKERS,
                config=SMALL)
    assert p.returncode == 0, p.stderr
    # Said once per worker, in the log, and only where "auto" took the momentum ("updates"
    # was asked for).
    assert p.stderr.count("averages the momentum of AdamW") == (
        WORKERS if mode.startswith("momentum") else 0), p.stderr
    assert "averages the updates" not in p.stderr, p.stderr
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(WORKERS)]
    want, scale = single_process(seed, mode, ranks[0]["job_seed"], cap)
    for r, got in enumerate(ranks):
        for k, v in want.items():
            assert torch.equal(got["state"][k], v), f"rank {r}, {k}"
    return ranks, scale


@pytest.mark.parametrize("route", ["host", "emulated"])
@pytest.mark.parametrize("mode", list(MAPS))
def test_distributed_optimizer_matches_the_single_process_run(
    pushpull, seed, tmp_path, monkeypatch, mode, route
):
    """On the host path with one bucket (DDP's 25 MiB), and on the device path (the emulated
    device) with buckets of 10 KiB (three buckets of this model, started as they fill)."""
    monkeypatch.setenv("PUSHPULL_TORCH_ROUTE", route)
    cap = 25 if route == "host" else 0.01
    ranks, scale = train_and_compare(pushpull, seed, tmp_path, mode, cap)
    for r, got in enumerate(ranks):
        assert got["scale"] == scale, f"rank {r}: loss scale"
    m = ranks[0]["metrics"]
    if mode == "amp":
        # One step overflowed on rank 1 only, and every rank skipped it.
        assert scale == AMP_SCALE / 2, scale
        assert m["rounds_non_finite"] >= 1, m
    else:
        assert m["rounds_non_finite"] == 0, m
    if MAPS[mode] is not None:
        codec = MAPS[mode]["byteps_compressor_type"]
        # The model's small tensors travel as float32 (min_compress_bytes) and cap the ratio,
        # and so do the WARMUP uncompressed steps of average="momentum".
        ratio = 1.5 if mode.startswith("momentum") else {
            "fp16": 1.5, "dithering": 3, "powersgd": 2}.get(codec, 4)
        assert m["bytes_pushed"] < m["raw_bytes"] / ratio, m
        first = tensors_of(make_model(0), mode, cap)[0][0]
        assert codec in " ".join(m["tensors"][first]["codecs"])
    if mode == "momentum16":
        # The warm-up's twin travelled as fp16.
        assert "fp16" in " ".join(m["tensors"]["Gradient.0.weight@warmup"]["codecs"]), m

    place = "emulated" if route == "emulated" and mode not in ("elias", "powersgd") else "cpu"
    first = tensors_of(make_model(0), mode, cap)[0][0]
    assert m["tensors"][first]["device"] == place, m["tensors"]
    if MAPS[mode] is None:
        assert m["bytes_pushed"] == m["raw_bytes"], m
    # The small gradients (under min_compress_bytes) travel as one tensor, with the bits each
    # would have had alone (checked above), unless nesterov momentum stays on them.
    fused = sorted(n for n in m["tensors"] if n.startswith("Gradient.fused["))
    if mode in ("onebit", "amp", "powersgd"):
        assert fused == [], fused
    else:
        assert fused == ["Gradient.fused[0.bias..2.bias]"], sorted(m["tensors"])
        assert "Gradient.0.bias" not in m["tensors"], sorted(m["tensors"])


@pytest.mark.parametrize("route", ["host", "emulated"])
@pytest.mark.parametrize("mode", ["onebit", "none"])
def test_an_ordered_step_gives_the_same_bits(pushpull, seed, tmp_path, monkeypatch, mode, route):
    """``ordered_step=True``: on the emulated route every step leaves its rounds' outcomes
    (and the non-finite check) for the next step's first bucket, and the parameters are still
    the single-process run's; on the host route a step cannot be ordered, so it waits."""
    monkeypatch.setenv("PUSHPULL_TORCH_ROUTE", route)
    ranks, _ = train_and_compare(pushpull, seed, tmp_path, mode, 0.01, "ordered")
    for got in ranks:
        assert got["deferred"] == (STEPS if route == "emulated" else 0), got["deferred"]


def test_collecting_an_ordered_step_waits_for_every_round_and_raises_the_first_error():
    """``_collect`` (the next step's first bucket, synchronize, save_state, shutdown) waits for
    every round of the ordered step, even after one failed, raises the first error, and
    leaves nothing to collect again."""
    from pushpull import PushPullError
    from pushpull.torch.optimizer import _DistributedOptimizer

    waited = []

    class Native:
        def __init__(self, name, error=None):
            self.name, self.error = name, error

        def wait(self):
            waited.append(self.name)
            if self.error:
                raise PushPullError(self.error)

    class Holder:
        _discard_non_finite = lambda self: waited.append("non-finite check")  # noqa: E731

    h = Holder()
    h._deferred = [Native("a"), Native("b", "b was lost"), Native("c", "c was lost")]
    with pytest.raises(PushPullError, match="b was lost"):
        _DistributedOptimizer._collect(h)
    assert waited == ["a", "b", "c"], waited
    assert h._deferred is None
    _DistributedOptimizer._collect(h)  # nothing left
    h._deferred = [Native("d")]
    _DistributedOptimizer._collect(h)
    assert waited == ["a", "b", "c", "d", "non-finite check"], waited


@pytest.mark.parametrize("route", ["host", "emulated"])
def test_fused_small_gradients_give_the_unfused_bits(pushpull, seed, tmp_path, monkeypatch, route):
    """jobs/fusion.py on CPU tensors (test_gpu.py runs it on CUDA)."""
    monkeypatch.setenv("PUSHPULL_TORCH_ROUTE", route)
    p = run_job(pushpull, "fusion.py", tmp_path, seed, "cpu", config=SMALL)
    assert p.returncode == 0, p.stderr
    check_fusion_job(tmp_path)


def test_models_whose_parameters_share_names_keep_apart(pushpull, seed, tmp_path):
    """jobs/two_models.py: three optimizers over models with the same parameter names (two of
    one shape, one of another) give the bits of the same models named apart by hand, and the
    later ones' gradients are declared as ``Gradient.NAME#2`` and ``#3``, not refused as
    declared with another length nor sharing the first one's error feedback."""
    p = run_job(pushpull, "two_models.py", tmp_path, seed, config=SMALL)
    assert p.returncode == 0, p.stderr
    for r in range(2):
        saved = torch.load(tmp_path / f"rank{r}.pt", weights_only=False)
        same, apart = saved["results"]["same names"], saved["results"]["distinct names"]
        assert len(same) == len(apart) == 6
        for k, (xs, ys) in enumerate(zip(same, apart)):
            for x, y in zip(xs, ys):
                assert torch.equal(x.view(torch.int32), y.view(torch.int32)), f"rank {r}, call {k}"
        tensors = saved["tensors"]
        for name in ("Gradient.0.weight", "Gradient.0.weight#2", "Gradient.0.weight#3"):
            assert name in tensors, tensors


def test_buckets_follow_the_backward_order_the_cap_and_the_groups():
    from pushpull.torch import _buckets

    # Sizes in elements (4 bytes each); the cap in bytes.
    assert _buckets([10, 20, 30], [0, 0, 0], 10**9) == [[2, 1, 0]]
    # A bucket closes once it holds the cap: 30 elements = 120 bytes >= 100.
    assert _buckets([10, 20, 30], [0, 0, 0], 100) == [[2], [1, 0]]
    assert _buckets([10, 20, 30], [0, 0, 0], 1) == [[2], [1], [0]]
    # A change of parameter group closes a bucket too.
    assert _buckets([1, 1, 1, 1], [0, 0, 1, 1], 10**9) == [[3, 2], [1, 0]]
    assert _buckets([], [], 100) == []


def test_horovods_groups_make_the_buckets():
    """``num_groups`` splits the parameters in order into equal runs (the first ones longer),
    ``groups`` makes each list a bucket and each other parameter its own; both split at a
    change of parameter group; bad values are refused naming the argument."""
    from pushpull.torch.optimizer import _horovod_buckets

    ps = [torch.zeros(1) for _ in range(5)]
    one = [0] * 5
    assert _horovod_buckets(ps, one, 0, None) is None
    assert _horovod_buckets(ps, one, 2, None) == [[2, 1, 0], [4, 3]]
    assert _horovod_buckets(ps, one, 0, 5) == [[0], [1], [2], [3], [4]]
    assert _horovod_buckets(ps, one, 9, None) == [[0], [1], [2], [3], [4]]
    assert _horovod_buckets(ps, one, 0, [[ps[3], ps[0]], [ps[4]]]) == [[3, 0], [4], [1], [2]]
    assert _horovod_buckets(ps, [0, 0, 1, 1, 1], 1, None) == [[1, 0], [4, 3, 2]]
    for args, what in [((-1, None), "num_groups"), ((0, "x"), "groups"),
                       ((0, [[ps[0]], [ps[0]]]), "one group only"),
                       ((0, [[torch.zeros(1)]]), "not a parameter")]:
        with pytest.raises(ValueError, match=what):
            _horovod_buckets(ps, one, *args)


def test_average_auto_leaves_the_gradients_only_where_they_train():
    """``average="auto"``: onebit or top-k with error feedback under Adam or AdamW averages
    the momentum, under SGD with momentum or AMSGrad the updates; plain SGD (the RFC's recipe:
    momentum in the map), onebit without error feedback and other compressors keep the
    gradients. ``"gradients"`` where they would not train, ``"momentum"`` for an optimizer
    it cannot run, ``ef = corrected`` with the updates or the momentum, and an unknown value
    are refused, naming what is wrong."""
    from pushpull.torch import _average

    w = torch.nn.Parameter(torch.zeros(3))
    onebit = {"compressor": "onebit", "scaling": "false", "ef": "vanilla"}
    sgd = torch.optim.SGD([w], lr=0.1)
    heavy = torch.optim.SGD([w], lr=0.1, momentum=0.9)
    adam = torch.optim.AdamW([w], lr=1e-3)
    names = ["Gradient.w", "Gradient.b"]
    plain = {"compressor": "none"}
    assert _average.resolve("auto", sgd, names, [onebit, plain]) == "gradients"
    assert _average.resolve("auto", heavy, names, [onebit, plain]) == "updates"
    assert _average.resolve("auto", adam, names, [plain, onebit]) == "momentum"
    amsgrad = torch.optim.Adam([w], lr=1e-3, amsgrad=True)
    assert _average.resolve("auto", amsgrad, names, [plain, onebit]) == "updates"
    assert _average.resolve("auto", adam, names, [{**onebit, "ef": "none"}, None]) == "gradients"
    assert _average.resolve("auto", adam, names, [{"compressor": "topk", "k": "0.01",
                                                   "ef": "vanilla"}, plain]) == "momentum"
    assert _average.resolve("auto", adam, names, [{"compressor": "fp16"}, plain]) == "gradients"
    assert _average.resolve("updates", sgd, names, [plain, plain]) == "updates"
    corrected = {**onebit, "ef": "corrected"}
    refusals = [
        ("gradients", adam, [plain, onebit],
         r"'Gradient.b'.*AdamW \(betas=\(0.9, 0.999\)\).*average='auto' \(or 'updates'\)"),
        ("gradients", heavy, [onebit, onebit], r"'Gradient.w'.*momentum=0.9"),
        ("auto", heavy, [corrected, plain],
         r"'Gradient.w': ef = 'corrected' with average='updates'.*'vanilla'"),
        ("momentum", heavy, [onebit, plain],
         r"average='momentum' runs Adam and AdamW only: SGD is not torch.optim.Adam or "
         r"AdamW; use average='updates'"),
        ("momentum", amsgrad, [onebit, plain], r"Adam has amsgrad=True"),
        ("auto", adam, [corrected, plain],
         r"'Gradient.w': ef = 'corrected' with average='momentum'"),
        ("grads", sgd, [plain, plain],
         r"average = 'grads': must be one of auto, gradients, updates, momentum"),
    ]
    for average, opt, maps, says in refusals:
        with pytest.raises(ValueError, match=says):
            _average.resolve(average, opt, names, maps)


def test_the_frozen_step_decays_as_the_optimizer_does_and_keeps_adams_layout(seed):
    """``_average.frozen_step``: Adam with ``decoupled_weight_decay=True`` decays the parameter
    as AdamW does, unlike plain Adam (whose decay is in the gradient, ``local_momentum``);
    the state keeps Adam's layout, so ``freeze`` reads the same second moment back."""
    from pushpull.torch import _average

    g = torch.Generator().manual_seed(seed)
    start, grad = torch.randn(50, generator=g), torch.randn(50, generator=g)

    def run(make):
        w = torch.nn.Parameter(start.clone())
        opt = make([w])
        w.grad = grad.clone()
        opt.step()  # the warm-up: Adam's own state
        v = _average.freeze(opt, [w])
        with torch.no_grad():
            w.grad = grad.clone()
            _average.local_momentum(opt, [w])
            _average.frozen_step(opt, [w], v)
        assert int(opt.state[w]["step"]) == 2
        assert torch.allclose(_average.freeze(opt, [w])[0], v[0], rtol=1e-6)
        return w.detach()

    adamw = run(lambda ps: torch.optim.AdamW(ps, lr=0.1, weight_decay=0.5))
    decoupled = run(lambda ps: torch.optim.Adam(ps, lr=0.1, weight_decay=0.5,
                                                decoupled_weight_decay=True))
    coupled = run(lambda ps: torch.optim.Adam(ps, lr=0.1, weight_decay=0.5))
    assert torch.equal(adamw, decoupled)
    assert not torch.allclose(adamw, coupled)
