"""Pipeline runtime in one process (one stage holding the whole model): every schedule kind gives
the whole-batch gradients in PyNative and jit; bad input is rejected with clear errors."""
import numpy as np
import pytest
from mindspore import nn

from mindformers_core import pipeline as pp
from mindformers_core.pipeline.runtime import PipelineStage
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
