"""The runtime executes DualPipeV through ``schedule.local_order`` (``lower_for_runtime``: each
FWD_BWD unit as its forward, then its backward). One process, both stages of the V on it (pp 1,
two stages), PyNative: loss and gradients equal one step on the whole batch."""
import numpy as np
import pytest

ms = pytest.importorskip("mindspore")
from mindspore import nn  # noqa: E402

import mindformers_core.pipeline as pp  # noqa: E402
from mindformers_core.pipeline.runtime import PipelineStage  # noqa: E402


def mse(out, y):
    return ((out - y) ** 2).mean()


def test_dualpipev_runs_lowered_and_matches_the_whole_batch():
    ms.set_seed(1)
    layers = [nn.Dense(8, 8, activation="tanh") for _ in range(4)]
    stages = [PipelineStage(nn.SequentialCell(layers[:2]), 0, 2, loss_fn=mse),
              PipelineStage(nn.SequentialCell(layers[2:]), 1, 2, loss_fn=mse)]
    sched = pp.ScheduleDualPipeV(stages, 4)
    assert any(s.type is pp.MetaStepType.FWD_BWD for s in sched.exec_order[0])
    assert not any(s.type is pp.MetaStepType.FWD_BWD for s in sched.local_order)
    rng = np.random.default_rng(0)
    x = ms.Tensor(rng.standard_normal((8, 8)).astype(np.float32))
    y = ms.Tensor(rng.standard_normal((8, 8)).astype(np.float32))
    loss = sched.run(x, y)

    whole = nn.SequentialCell(layers)
    params = whole.trainable_params()
    value, grads = ms.value_and_grad(lambda a, b: mse(whole(a), b), None, params)(x, y)
    np.testing.assert_allclose(float(loss.asnumpy()), float(value.asnumpy()), rtol=1e-5)
    got = [g.asnumpy() for st in stages for g in st.grads]
    for g, r in zip(got, grads):
        np.testing.assert_allclose(g, r.asnumpy(), rtol=1e-4, atol=1e-6)
