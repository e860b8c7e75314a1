"""Pipeline runtime in one process (one stage holding the whole model, or two stages on one rank):
every schedule kind gives the whole-batch gradients in PyNative and jit, also with dropout (without
recompute the backward uses its forward's record; with recompute it replays the forward's random
state); a stage forward runs once per microbatch without recompute and again in each backward
pass with it; bad input is rejected with clear errors."""
import warnings

import numpy as np
import mindspore as ms
import pytest
from mindspore import nn, ops

from mindformers_core import pipeline as pp
from mindformers_core.pipeline.runtime import PipelineStage
from mindformers_core.pipeline.options import RuntimeOptions
from tests.bodies.pipeline_body import _data, _layers, _sgd, loss_fn, reference


@pytest.mark.parametrize("mode", ["pynative", "jit"])
@pytest.mark.parametrize("schedule", [pp.ScheduleGPipe, pp.Schedule1F1B, pp.ScheduleZeroBubbleH1])
def test_single_stage_matches_whole_batch(schedule, mode):
    stage = PipelineStage(nn.SequentialCell(_layers()), 0, 1, loss_fn=loss_fn)
    sched = schedule(stage, 4)
    losses = []
    for step in range(2):
        losses.append(float(sched.run(*_data(step), mode=mode).asnumpy()))
        _sgd(stage.params, stage.grads)
    ref_losses, ref_params = reference(2)
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-5)
    for p, ref in zip(stage.params, ref_params):
        np.testing.assert_allclose(p.asnumpy(), ref, rtol=1e-5, atol=1e-6)



@pytest.mark.parametrize("regrow", [False, True])
def test_jit_stage_reads_parameters_replaced_by_set_data(regrow):
    """set_data swaps a Parameter's buffer (loading a checkpoint; hsdp level3 shrinking a weight to
    its shard and regathering it): the compiled stage functions must read the new values, not the
    buffer they were compiled with."""
    from mindspore import Tensor
    stage = PipelineStage(nn.SequentialCell(_layers()), 0, 1, loss_fn=loss_fn)
    sched = pp.Schedule1F1B(stage, 2)
    x, y = _data(0)
    before = float(sched.run(x, y, mode="jit").asnumpy())
    for p in stage.params:
        value = p.asnumpy() * 0.5
        if regrow:   # shrink to a shard and grow back, as hsdp level3 does between steps
            p.set_data(Tensor(value[: value.shape[0] // 2]), slice_shape=True)
            p.set_data(Tensor(value), slice_shape=True)
        else:
            p.set_data(Tensor(value))
    got = float(sched.run(x, y, mode="jit").asnumpy())
    jit_grads = [g.asnumpy() for g in stage.grads]
    want = float(sched.run(x, y, mode="pynative").asnumpy())
    assert abs(got - before) > 1e-3, "the jit stage still computes with the old weights"
    assert abs(got - want) <= 1e-5 * abs(want), (got, want)
    for a, b in zip(jit_grads, stage.grads):
        np.testing.assert_allclose(a, b.asnumpy(), rtol=1e-5, atol=1e-6)

def test_bad_input():
    stage = PipelineStage(nn.SequentialCell(_layers()), 0, 1, loss_fn=loss_fn)
    sched = pp.Schedule1F1B(stage, 3)
    x, y = _data(0)  # batch 8 does not split into 3
    with pytest.raises(ValueError, match=r"inputs of shape \(8, 16\) cannot be split along dim 0 into micro_batch_num=3"):
        sched.run(x, y)
    with pytest.raises(ValueError, match="needs 3 microbatches of labels, got none"):
        sched.run_microbatches([x] * 3, None)
    with pytest.raises(ValueError, match="the last stage \\(1\\) needs loss_fn"):
        PipelineStage(nn.Dense(2, 2), 1, 2)
    with pytest.raises(ValueError, match="mode='graph'"):
        sched.run(x, y, mode="graph")


class _Scaled(nn.Cell):
    """A first stage with two arguments: a batch and a scalar (replicated to every microbatch)."""

    def __init__(self):
        super().__init__()
        self.body = nn.SequentialCell(_layers())

    def construct(self, x, scale):
        return self.body(x) * scale


@pytest.mark.parametrize("mode", ["pynative", "jit"])
def test_first_stage_with_several_inputs_and_a_spec(mode):
    import mindspore as ms
    from mindspore import Tensor
    net = _Scaled()
    x, y = _data(0)
    scale = Tensor(np.float32(0.5))
    ref = ms.value_and_grad(lambda a, b, c: loss_fn(net(a, b), c), None, net.trainable_params())(x, scale, y)
    stage = PipelineStage(net, 0, 1, loss_fn=loss_fn)
    config = pp.MicrobatchConfig(split_input=(pp.TensorChunkSpec(0), pp.ReplicateSpec()))
    loss = pp.Schedule1F1B(stage, 4).run((x, scale), y, mode=mode, config=config)
    np.testing.assert_allclose(float(loss.asnumpy()), float(ref[0].asnumpy()), rtol=1e-5)
    for g, r in zip(stage.grads, ref[1]):
        np.testing.assert_allclose(g.asnumpy(), r.asnumpy(), rtol=1e-5, atol=1e-6)


# ---- dropout: the backward's recomputed forward must draw the forward's masks ----------------------------
SEED, DROP = 7, 0.3


class _Dropout(nn.Cell):
    def construct(self, x):
        return ops.dropout(x, p=DROP, training=True)


def _dropout_cells():
    """The 8 tanh layers with a dropout after every second one (a stage ends with a dropout)."""
    cells = []
    for i, layer in enumerate(_layers()):
        cells += [layer, _Dropout()] if i % 2 else [layer]
    return cells


def _dropout_reference(steps, m, mode):
    """Each microbatch through the whole model with value_and_grad, in microbatch order (the order the
    pipeline's forwards draw random numbers in), gradients summed: what a pipeline step must give."""
    ms.set_seed(SEED)
    net = nn.SequentialCell(_dropout_cells())
    params = net.trainable_params()

    def micro_loss(x, y):
        return loss_fn(net(x), y) / m
    grad_fn = ms.value_and_grad(micro_loss, None, params)
    grad_fn = ms.jit(grad_fn) if mode == "jit" else grad_fn
    losses, grads = [], []
    for step in range(steps):
        x, y = _data(step)
        rows = x.shape[0] // m
        total, summed = 0.0, None
        for i in range(m):
            loss, g = grad_fn(x[i * rows:(i + 1) * rows], y[i * rows:(i + 1) * rows])
            total += float(loss.asnumpy())
            summed = g if summed is None else tuple(a + b for a, b in zip(summed, g))
        losses.append(total)
        grads.append([g.asnumpy() for g in summed])
        _sgd(params, summed)
    return losses, grads


def _dropout_pipeline(build, steps, m, mode, recompute=True):
    """``build(stage_cells, m, recompute) -> (schedule, stages)`` on this one process; losses and
    summed grads."""
    ms.set_seed(SEED)
    sched, stages = build(_dropout_cells(), m, recompute)
    losses, grads = [], []
    for step in range(steps):
        losses.append(float(sched.run(*_data(step), mode=mode).asnumpy()))
        grads.append([g.asnumpy() for st in stages for g in st.grads])
        for st in stages:
            _sgd(st.params, st.grads)
    return losses, grads


def _one_stage(cls):
    def build(cells, m, recompute=False):
        stage = PipelineStage(nn.SequentialCell(cells), 0, 1, loss_fn=loss_fn, recompute=recompute)
        return cls(stage, m), [stage]
    return build


def _two_stages(cls):
    """Both stages on this one process (pp_size 1, two virtual stages): handoffs, no transfers."""
    def build(cells, m, recompute=False):
        half = len(cells) // 2
        stages = [PipelineStage(nn.SequentialCell(cells[:half]), 0, 2, loss_fn=loss_fn, recompute=recompute),
                  PipelineStage(nn.SequentialCell(cells[half:]), 1, 2, loss_fn=loss_fn, recompute=recompute)]
        return cls(stages, m), stages
    return build


class _BackwardsReversed(pp.PipelineScheduleSingle):
    """GPipe with the backwards in reverse microbatch order (valid, but not forward order)."""

    def construct_exec_order(self):
        m = self.micro_batch_num
        self.exec_order[0] = ([pp.MetaStep(i, pp.MetaStepType.FWD, 0) for i in range(m)]
                              + [pp.MetaStep(i, pp.MetaStepType.BWD, 0) for i in reversed(range(m))])


DROPOUT_RUNS = {"gpipe": _one_stage(pp.ScheduleGPipe), "1f1b": _one_stage(pp.Schedule1F1B),
                "zb_h1": _one_stage(pp.ScheduleZeroBubbleH1),
                "interleaved": _two_stages(pp.ScheduleInterleaved1F1B), "zbv": _two_stages(pp.ScheduleZeroBubbleV)}


def _assert_dropout_parity(got, ref, what):
    np.testing.assert_allclose(got[0], ref[0], rtol=1e-5, err_msg=f"{what}: losses")
    for step, (gs, rs) in enumerate(zip(got[1], ref[1])):
        for k, (g, r) in enumerate(zip(gs, rs)):
            err = np.abs(g - r).max() / np.abs(r).max()
            assert err <= 1e-5, f"{what}: step {step} gradient {k}: relative error {err:.2e}"


# Under jit, 2 microbatches x 2 steps: MindSpore 2.10's CPU dropout inside a compiled graph was measured
# to give run-to-run different masks from about the 6th launch of a graph on (same seed, same program,
# also with one dropout and runtime_num_threads=1), so the jit check stays at 4 launches per graph.
DROPOUT_MICROBATCHES = {"pynative": 4, "jit": 2}


# every schedule in PyNative; under jit one single-stage (1F1B) and one two-stage (ZBV) schedule: the replay is
# the runtime's, the same for every schedule, and each jit run compiles its own graphs (~4 s)
JIT_DROPOUT_RUNS = ("1f1b", "zbv")


@pytest.mark.parametrize("recompute", [False, True])
@pytest.mark.parametrize("name, mode", [(n, "pynative") for n in DROPOUT_RUNS] + [(n, "jit") for n in JIT_DROPOUT_RUNS])
def test_dropout_masks_replayed_in_backward(name, mode, recompute):
    """Dropout 0.3 after every second layer, two SGD steps: loss and every gradient equal those of
    per-microbatch value_and_grad in one process (whose backward uses its forward's masks). Without
    recompute the backward uses its forward's record; with recompute, without the replay the
    backward's recomputed forward would draw new masks (gradients off by O(1))."""
    m = DROPOUT_MICROBATCHES[mode]
    ref = _dropout_reference(2, m, mode)
    _assert_dropout_parity(_dropout_pipeline(DROPOUT_RUNS[name], 2, m, mode, recompute), ref,
                           f"{name} {mode} recompute={recompute}")


def test_dropout_is_live_in_the_reference():
    """The check above is not vacuous: with dropout the reference loss differs from the plain model's."""
    with_dropout = _dropout_reference(1, 4, "pynative")[0][0]
    plain = reference(1)[0][0]
    assert abs(with_dropout - plain) > 1e-2 * abs(plain), (with_dropout, plain)


@pytest.mark.parametrize("mode", ["pynative", "jit"])
def test_dropout_in_any_backward_order_without_recompute(mode):
    """The backward consumes the forward's record of its microbatch: backwards in reverse order
    match, in both modes, and no order is warned about."""
    m = DROPOUT_MICROBATCHES[mode]
    ref = _dropout_reference(2, m, mode)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        got = _dropout_pipeline(_one_stage(_BackwardsReversed), 2, m, mode, recompute=False)
    _assert_dropout_parity(got, ref, f"reversed {mode}")


def test_dropout_replayed_in_any_backward_order_pynative_and_jit_warns():
    """Recompute: PyNative replays each microbatch's own random state, so backwards in reverse order
    still match; under jit masks follow the compiled kernel's launch count, so such an order is
    warned about."""
    ref = _dropout_reference(2, 4, "pynative")
    _assert_dropout_parity(_dropout_pipeline(_one_stage(_BackwardsReversed), 2, 4, "pynative", True), ref,
                           "reversed")
    stage = PipelineStage(nn.SequentialCell(_dropout_cells()), 0, 1, loss_fn=loss_fn, recompute=True)
    with pytest.warns(RuntimeWarning, match=r"stage 0: BWD microbatches \[3, 2, 1, 0\] vs FWD \[0, 1, 2, 3\]"):
        _BackwardsReversed(stage, 4).runtime("jit")
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        pp.ScheduleGPipe(stage, 4).runtime("jit")   # forward order: no warning


# ---- what the runtime holds between forward and backward -------------------------------------------------
def _plain(build, m, recompute=False):
    sched, stages = build([layer for layer in _layers()], m, recompute)
    return sched, stages


@pytest.mark.parametrize("recompute", [False, True])
@pytest.mark.parametrize("name", list(DROPOUT_RUNS))
def test_memory_held_matches_the_schedule(name, recompute):
    """``runtime.memory`` counts the microbatches held for the backward. Without recompute (the
    forward's record, freed by BWD or by BWD_INPUT, which computes both halves): per rank and per
    stage the simulator's peak in flight. With recompute (the stage input, until BWD or
    BWD_WEIGHT): per rank the simulator's peak until the weight gradient, per stage (unsplit
    backward) its peak in flight. The bytes are that count times one microbatch's stage input;
    GPipe holds all m."""
    m = 4
    sched, stages = _plain(DROPOUT_RUNS[name], m, recompute)
    sched.run(*_data(0))
    mem = sched.runtime("pynative").memory
    sim = pp.simulate(sched)
    want = sim.peak_until_weight_grad[0] if recompute else sim.peak_in_flight[0]
    assert mem.peak_rank_microbatches == want, (name, mem.as_dict())
    split = recompute and name in ("zb_h1", "zbv")
    for s, count in mem.peak_microbatches.items():
        if not split:
            assert count == sim.peak_in_flight_per_stage[s], (name, s, mem.as_dict())
        assert mem.peak_bytes[s] == count * (8 // m) * 16 * 4, (name, s, mem.as_dict())
    if name == "gpipe":
        assert mem.peak_microbatches == {0: m}
    if name == "1f1b":    # one rank, one stage: each microbatch's backward right after its forward
        assert mem.peak_microbatches == {0: 1}


def test_tables_drop_what_no_later_step_needs():
    """1F1B on one stage holds one microbatch at a time: the tables' peak stays at one stage input,
    its label and the loss (activations, gradients and losses of finished microbatches are dropped)."""
    sched, _ = _plain(_one_stage(pp.Schedule1F1B), 4)
    sched.run(*_data(0))
    one = (8 // 4) * 16 * 4
    assert sched.runtime("pynative").memory.peak_table_bytes == 2 * one + 4
    sched, _ = _plain(_one_stage(pp.ScheduleGPipe), 4)
    sched.run(*_data(0))
    assert sched.runtime("pynative").memory.peak_table_bytes == 4 * (2 * one + 4)


# ---- how often a stage forward runs ------------------------------------------------------------------------
class _Counted(nn.Cell):
    """The 8 tanh layers behind a counter that the graph itself increments (a side effect inside
    the compiled graph under jit), once per execution of this forward."""

    def __init__(self):
        super().__init__()
        self.body = nn.SequentialCell(_layers())
        self.count = ms.Parameter(ms.Tensor(np.zeros((1,), np.float32)), name="forward_count", requires_grad=False)

    def construct(self, x):
        x = ops.depend(x, ops.assign_add(self.count, ops.ones((1,), ms.float32)))
        return self.body(x)


@pytest.mark.parametrize("mode", ["pynative", "jit"])
@pytest.mark.parametrize("schedule, split", [(pp.Schedule1F1B, False), (pp.ScheduleZeroBubbleH1, True)])
@pytest.mark.parametrize("recompute", [False, True])
def test_forward_runs_once_per_microbatch_without_recompute(recompute, schedule, split, mode):
    """Without recompute a stage forward runs once per microbatch (the backward uses its record);
    with recompute once more per backward pass: BWD once, BWD_INPUT and BWD_WEIGHT once each. Under jit
    a last stage whose BWD follows its FWD (1F1B) runs both in one call: once per microbatch also with
    recompute, and as before with the fusion turned off (``RuntimeOptions.fuse_last``)."""
    for fuse in ([True, False] if mode == "jit" and not split else [True]):
        cell = _Counted()
        stage = PipelineStage(cell, 0, 1, loss_fn=loss_fn, recompute=recompute,
                              options=RuntimeOptions(fuse_last=fuse))
        m, steps = 4, 2
        sched = schedule(stage, m)
        for step in range(steps):
            sched.run(*_data(step), mode=mode)
        fused = fuse and mode == "jit" and not split
        per_microbatch = 1 + (0 if not recompute or fused else 2 if split else 1)
        assert int(cell.count.asnumpy()[0]) == per_microbatch * m * steps, (fuse, recompute)


@pytest.mark.parametrize("schedule", [pp.ScheduleGPipe, pp.Schedule1F1B])
def test_recompute_config_cells_keep_the_gradients(schedule):
    """PyNative: MindSpore's recompute units (Cell.recompute(), what recompute_config applies) pair
    their re-run with records by nesting order, wrong with several records outstanding (GPipe);
    a stage holding them recomputes, and its gradients equal the plain stage's."""
    def grads(mark):
        net = nn.SequentialCell(_layers())
        if mark:
            net[1].recompute()
            net[5].recompute()
        stage = PipelineStage(net, 0, 1, loss_fn=loss_fn)
        schedule(stage, 4).run(*_data(0))
        return stage, [g.asnumpy() for g in stage.grads]
    marked, got = grads(True)
    assert marked.recomputes("pynative")
    for g, r in zip(got, grads(False)[1]):
        np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-6)
