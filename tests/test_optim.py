"""AdamW against a NumPy reference and nn.AdamWeightDecay, lr schedules, global-norm clipping
(PyNative and jit, one process)."""
import math

import numpy as np
import mindspore as ms
import pytest
from mindspore import Parameter, Tensor, nn, ops

from mindformers_core.optim import (AdamW, ClipGradNorm, ConstantWarmUpLR, CosineWithWarmUpLR,
                                    LinearWithWarmUpLR, build_lr_schedule, clip_grad_norm, global_norm,
                                    replication_weights)
from mindformers_core.sharding.annotations import annotate_parameter
from mindformers_core.sharding.layout import Layout

MODES = ["pynative", "jit"]


def _maybe_jit(fn, mode):
    return ms.jit(fn) if mode == "jit" else fn


def numpy_adamw(params, grads_per_step, lrs, betas, eps, wd, decayed, bias_correction=True):
    params = [p.astype(np.float64) for p in params]
    m = [np.zeros_like(p) for p in params]
    v = [np.zeros_like(p) for p in params]
    b1, b2 = betas
    for t, (grads, lr) in enumerate(zip(grads_per_step, lrs), start=1):
        for i, g in enumerate(grads):
            m[i] = b1 * m[i] + (1 - b1) * g
            v[i] = b2 * v[i] + (1 - b2) * g * g
            c1, c2 = (1 - b1 ** t, 1 - b2 ** t) if bias_correction else (1.0, 1.0)
            update = (m[i] / c1) / (np.sqrt(v[i] / c2) + eps)
            params[i] = params[i] - lr * (update + (wd if decayed[i] else 0.0) * params[i])
    return params


@pytest.mark.parametrize("mode", MODES)
def test_adamw_matches_numpy(mode):
    rng = np.random.default_rng(0)
    init = [rng.standard_normal((4, 3)).astype(np.float32), rng.standard_normal((3,)).astype(np.float32),
            rng.standard_normal((3,)).astype(np.float32)]
    params = [Parameter(Tensor(a), name=n) for a, n in zip(init, ["w", "b", "norm.gamma"])]
    schedule = CosineWithWarmUpLR(0.05, warmup_steps=2, total_steps=6, lr_end=0.001)
    opt = AdamW(params, schedule, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.1)
    grads = [[rng.standard_normal(a.shape).astype(np.float32) for a in init] for _ in range(6)]
    step = _maybe_jit(lambda *g: opt(g), mode) if mode == "pynative" else ms.jit(_apply(opt))
    for g in grads:
        step(*(Tensor(x) for x in g))
    assert int(opt.global_step.asnumpy()) == 6
    lrs = [schedule.at(t) for t in range(6)]
    assert lrs[0] == 0.0 and lrs[1] == pytest.approx(0.025)
    want = numpy_adamw(init, grads, lrs, (0.8, 0.95), 1e-6, 0.1, decayed=[True, True, False])
    for p, w in zip(params, want):
        np.testing.assert_allclose(p.asnumpy(), w, rtol=1e-5, atol=1e-6)
    assert opt.current_lr() == pytest.approx(schedule.at(6))


def _apply(opt):
    def step(*grads):
        return opt(grads)
    return step


@pytest.mark.parametrize("mode", MODES)
def test_without_bias_correction_equals_nn_adamweightdecay(mode):
    def make():
        net = nn.Dense(5, 3)
        rng = np.random.default_rng(1)
        net.weight.set_data(Tensor(rng.standard_normal((3, 5)).astype(np.float32)))
        net.bias.set_data(Tensor(rng.standard_normal((3,)).astype(np.float32)))
        return net
    ours, theirs = make(), make()
    opt_a = AdamW(ours.trainable_params(), 0.01, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.1,
                  bias_correction=False)
    opt_b = nn.AdamWeightDecay(theirs.trainable_params(), 0.01, 0.9, 0.999, 1e-6, 0.1)
    x = Tensor(np.random.default_rng(2).standard_normal((7, 5)).astype(np.float32))

    def loss_a(x):
        return (ours(x) ** 2).sum()

    def loss_b(x):
        return (theirs(x) ** 2).sum()
    grad_a = ms.value_and_grad(loss_a, None, opt_a.parameters)
    grad_b = ms.value_and_grad(loss_b, None, opt_b.parameters)

    def step_a(x):
        loss, g = grad_a(x)
        opt_a(g)
        return loss

    def step_b(x):
        loss, g = grad_b(x)
        opt_b(g)
        return loss
    step_a, step_b = _maybe_jit(step_a, mode), _maybe_jit(step_b, mode)
    for _ in range(4):
        np.testing.assert_allclose(step_a(x).asnumpy(), step_b(x).asnumpy(), rtol=1e-5)
    for a, b in zip(ours.trainable_params(), theirs.trainable_params()):
        np.testing.assert_allclose(a.asnumpy(), b.asnumpy(), rtol=1e-5, atol=1e-5 * np.abs(b.asnumpy()).max())


def _fused_and_elementwise(bias_correction, steps=6):
    """The same parameters, gradients (NaN at step 3: skipped) and schedule through the fused and
    the elementwise AdamW; returns (fused params, elementwise params, numpy params, optimizers)."""
    rng = np.random.default_rng(5)
    init = [rng.standard_normal((8, 6)).astype(np.float32) * 0.5, rng.standard_normal((6,)).astype(np.float32),
            rng.standard_normal((6,)).astype(np.float32)]
    names = ["w", "b", "norm.gamma"]
    sets = [[Parameter(Tensor(a), name=f"{tag}.{n}") for a, n in zip(init, names)] for tag in ("f", "e")]
    schedule = CosineWithWarmUpLR(0.02, warmup_steps=2, total_steps=steps, lr_end=0.001)
    fused = AdamW(sets[0], schedule, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, bias_correction=bias_correction)
    elementwise = AdamW(sets[1], schedule, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1,
                        bias_correction=bias_correction, fused=False)
    assert fused.fused and not elementwise.fused
    grads = [[rng.standard_normal(a.shape).astype(np.float32) for a in init] for _ in range(steps)]
    grads[2][0][1, 1] = np.nan
    return sets, (fused, elementwise), grads, init, schedule


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("bias_correction", [True, False])
def test_fused_adamw_equals_the_elementwise_update_and_numpy(mode, bias_correction):
    """The fused kernel (construct on float32 parameters) against the elementwise form it replaced
    and a float64 NumPy AdamW over 6 steps, one of them skipped (NaN gradient, ok False)."""
    sets, opts, grads, init, schedule = _fused_and_elementwise(bias_correction)
    steps = []
    for opt in opts:
        def step(g, ok, opt=opt):
            return opt(g, ok)
        steps.append(_maybe_jit(step, mode))
    applied, lrs, kept = [], [], []
    for t, g in enumerate(grads):
        ok = bool(np.isfinite(np.concatenate([x.ravel() for x in g])).all())
        before = [[p.asnumpy().copy() for p in ps] + [m.asnumpy().copy() for m in o.moment1] for ps, o in zip(sets, opts)]
        for fn in steps:
            fn(ms.mutable(tuple(Tensor(x) for x in g)), Tensor(ok))
        if ok:
            applied.append(g)
            lrs.append(schedule.at(len(lrs)))
        else:       # skipped: parameters and moments bitwise as they were, the counter too
            after = [[p.asnumpy() for p in ps] + [m.asnumpy() for m in o.moment1] for ps, o in zip(sets, opts)]
            kept.append(all(np.array_equal(a, b) for x, y in zip(before, after) for a, b in zip(x, y)))
    assert kept == [True]
    assert [int(o.global_step.asnumpy()) for o in opts] == [len(applied)] * 2
    want = numpy_adamw(init, applied, lrs, (0.9, 0.95), 1e-8, 0.1, decayed=[True, True, False],
                       bias_correction=bias_correction)
    for f, e, w in zip(sets[0], sets[1], want):
        f, e = f.asnumpy(), e.asnumpy()
        scale = np.abs(w).max()
        # fused vs the old elementwise update: within 1e-6 of the tensor's scale
        assert np.abs(f - e).max() <= 1e-6 * scale, (np.abs(f - e).max(), scale)
        # and no further from float64 than the elementwise update is (+ one float32 ulp of the scale)
        assert np.abs(f - w).max() <= np.abs(e - w).max() + 1.2e-7 * scale
        np.testing.assert_allclose(f, w, rtol=1e-5, atol=1e-6 * scale)


def test_fused_needs_float32():
    p = Parameter(Tensor(np.ones((2,), np.float16)), name="h")
    assert not AdamW([p], 0.1).fused
    with pytest.raises(ValueError, match=r"fused=True needs float32 parameters; got \['Float16'\]"):
        AdamW([p], 0.1, fused=True)


def test_apply_on_shard_views_equals_the_full_update():
    """What hsdp relies on: states shrunk to a shard + apply(narrow(param)) == narrow(full update)."""
    rng = np.random.default_rng(3)
    init = rng.standard_normal((6, 4)).astype(np.float32)
    grads = [rng.standard_normal((6, 4)).astype(np.float32) for _ in range(3)]
    full = Parameter(Tensor(init), name="full")
    opt_full = AdamW([full], 0.1, weight_decay=0.05, fused=False)     # apply's own form on the whole
    pieces = []
    for k in range(2):
        p = Parameter(Tensor(init), name=f"copy{k}")
        opt = AdamW([p], 0.1, weight_decay=0.05)
        for state in opt.state_of(0):
            state.set_data(Tensor(np.zeros((3, 4), np.float32)), slice_shape=True)
        pieces.append((p, opt))
    for g in grads:
        opt_full((Tensor(g),))
        for k, (p, opt) in enumerate(pieces):
            new = opt.apply((ops.narrow(p, 0, 3 * k, 3),), (Tensor(g[3 * k:3 * k + 3]),))
            whole = p.asnumpy()
            whole[3 * k:3 * k + 3] = new[0].asnumpy()
            p.set_data(Tensor(whole))
    for k, (p, opt) in enumerate(pieces):
        np.testing.assert_allclose(p.asnumpy()[3 * k:3 * k + 3], full.asnumpy()[3 * k:3 * k + 3], rtol=1e-6)
        assert opt.state_of(0)[0].shape == (3, 4)


@pytest.mark.parametrize("kwargs, message", [
    ({"betas": (0.9,)}, r"betas=\(0.9,\) must be two numbers in \[0, 1\)"),
    ({"betas": (0.9, 1.0)}, "betas"),
    ({"eps": 0.0}, "eps=0.0 must be > 0"),
    ({"weight_decay": -1.0}, "weight_decay=-1.0 must be >= 0"),
])
def test_adamw_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        AdamW([Parameter(Tensor(np.zeros((2,), np.float32)), name="p")], **kwargs)
    with pytest.raises(ValueError, match="params is empty"):
        AdamW([])


# ---- learning-rate schedules -----------------------------------------------------------------
@pytest.mark.parametrize("mode", MODES)
def test_schedules_graph_equals_python(mode):
    schedules = [ConstantWarmUpLR(0.1, 3), ConstantWarmUpLR(0.1),
                 LinearWithWarmUpLR(0.1, 2, 10, lr_end=0.01), CosineWithWarmUpLR(0.1, 0, 8),
                 CosineWithWarmUpLR(0.1, 4, 12, lr_end=0.02, warmup_lr_init=0.01)]
    for s in schedules:
        fn = _maybe_jit(s, mode) if mode == "pynative" else s
        for t in range(14):
            got = float(fn(Tensor(t, ms.int32)).asnumpy())
            assert got == pytest.approx(s.at(t), rel=1e-5, abs=1e-8), (type(s).__name__, t)


def test_schedule_values():
    cos = CosineWithWarmUpLR(1.0, 2, 10, lr_end=0.1)
    assert [cos.at(t) for t in (0, 1, 2)] == [0.0, 0.5, 1.0]
    assert cos.at(6) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert cos.at(10) == pytest.approx(0.1) and cos.at(50) == pytest.approx(0.1)
    lin = LinearWithWarmUpLR(1.0, 0, 4)
    assert [lin.at(t) for t in range(6)] == [1.0, 0.75, 0.5, 0.25, 0.0, 0.0]
    assert ConstantWarmUpLR(0.3, 3).at(1) == pytest.approx(0.1)
    assert build_lr_schedule("CosineWithWarmUpLR", 1.0, 2, 10).at(2) == 1.0


@pytest.mark.parametrize("call, message", [
    (lambda: build_lr_schedule("Cosine", 1.0), r"type='Cosine' is not known; valid values are \["),
    (lambda: build_lr_schedule("LinearWithWarmUpLR", 1.0), "needs total_steps"),
    (lambda: CosineWithWarmUpLR(1.0, 5, 5), "total_steps=5 must be greater than warmup_steps=5"),
    (lambda: ConstantWarmUpLR(-1.0), "learning_rate=-1.0 must be a number >= 0"),
    (lambda: LinearWithWarmUpLR(1.0, 1.5, 10), "warmup_steps=1.5 must be an integer"),
])
def test_schedule_bad_arguments(call, message):
    with pytest.raises(ValueError, match=message):
        call()


# ---- clipping --------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", MODES)
def test_clip_grad_norm(mode):
    rng = np.random.default_rng(4)
    gs = [rng.standard_normal((3, 4)).astype(np.float32), rng.standard_normal((5,)).astype(np.float32)]
    norm = math.sqrt(sum(float((g.astype(np.float64) ** 2).sum()) for g in gs))
    cell = ClipGradNorm(1.0)
    fn = _maybe_jit(lambda *g: cell(g), mode) if mode == "pynative" else ms.jit(_clip(cell))
    clipped, total = fn(*(Tensor(g) for g in gs))
    assert float(total.asnumpy()) == pytest.approx(norm, rel=1e-6)
    for c, g in zip(clipped, gs):
        np.testing.assert_allclose(c.asnumpy(), g / (norm + 1e-6), rtol=1e-5)
    # below the limit: unchanged
    clipped, _ = clip_grad_norm([Tensor(g) for g in gs], 2 * norm)
    for c, g in zip(clipped, gs):
        np.testing.assert_allclose(c.asnumpy(), g, rtol=1e-6)


def _clip(cell):
    def fn(*g):
        return cell(g)
    return fn


def test_global_norm_weights_and_replication():
    gs = [Tensor(np.full((2, 2), 2.0, np.float32)), Tensor(np.full((4,), 1.0, np.float32))]
    # the second piece is replicated over 4 ranks: it counts 1/4 per rank
    assert float(global_norm(gs, weights=[1.0, 0.25]).asnumpy()) == pytest.approx(math.sqrt(16 + 1))
    mesh = Layout((2, 4), ("dp", "tp"))
    w = Parameter(Tensor(np.zeros((4, 8), np.float32)), name="w")
    annotate_parameter(w, mesh("None", "tp"), (4, 32), ())
    ln = Parameter(Tensor(np.zeros((8,), np.float32)), name="ln")
    assert replication_weights([w, ln], {"tp": 4}) == (1.0, 0.25)
    assert replication_weights([w, ln], {"tp": 4, "dp": 2}) == (0.5, 0.125)
    with pytest.raises(ValueError, match="max_norm=0 must be a number > 0"):
        ClipGradNorm(0)


@pytest.mark.parametrize("fused", [None, False])
def test_a_skipped_first_step_leaves_the_weights_as_they_were(fused):
    """The guard skipping the very first step (global_step 0): weights, moments and the counter unchanged, no
    NaN from the bias corrections of step 0 (1 - beta^0 = 0)."""
    import mindspore as ms
    from mindspore import Parameter, Tensor
    from mindformers_core.optim import AdamW
    p = Parameter(Tensor(np.array([1.0, -2.0], np.float32)), name="p")
    opt = AdamW([p], 0.1, fused=fused)
    opt((Tensor(np.array([0.5, 0.5], np.float32)),), Tensor(False))
    assert p.asnumpy().tolist() == [1.0, -2.0] and int(opt.global_step.asnumpy()) == 0
    assert not np.isnan(opt.moment1[0].asnumpy()).any()
    opt((Tensor(np.array([0.5, 0.5], np.float32)),), Tensor(True))
    assert int(opt.global_step.asnumpy()) == 1 and np.isfinite(p.asnumpy()).all() and p.asnumpy()[0] < 1.0
