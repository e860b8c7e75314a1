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


# ---- the bidirectional DualPipe ------------------------------------------------------------------------

def _dualpipe_stages(p, width=8, layers_per_stage=2):
    """All 2p stages in one process: the down copy holds the model's layers, the up copy freshly
    initialised layers (the runtime gives it the down copy's weights)."""
    ms.set_seed(3)
    layers = [nn.Dense(width, width, activation="tanh") for _ in range(p * layers_per_stage)]
    down = [nn.SequentialCell(layers[k * layers_per_stage:(k + 1) * layers_per_stage]) for k in range(p)]
    up = [nn.SequentialCell([nn.Dense(width, width, activation="tanh") for _ in range(layers_per_stage)])
          for _ in range(p)]
    stages = [PipelineStage(cell, k, 2 * p, loss_fn=mse if k == p - 1 else None) for k, cell in enumerate(down)]
    stages += [PipelineStage(cell, p + k, 2 * p, loss_fn=mse if k == p - 1 else None) for k, cell in enumerate(up)]
    return layers, stages


@pytest.mark.parametrize("mode", ["pynative", "jit"])
@pytest.mark.parametrize("p, m", [(2, 4), (4, 8)])
def test_dualpipe_one_process_matches_the_whole_batch(p, m, mode):
    """One process holding all 2p stages runs DualPipe's p ranks' steps (merged by their ideal start): the loss
    and the gradient of every parameter of both copies equal one step of the whole model on the whole batch."""
    layers, stages = _dualpipe_stages(p)
    sched = pp.ScheduleDualPipe(stages, m)
    assert sched.routes[0] == range(0, p) and sched.routes[m - 1] == range(p, 2 * p)
    assert sched.copies == [(k, p + k) for k in range(p)]
    assert any(s.type is pp.MetaStepType.FWD_BWD for s in sched.exec_order[0])
    # no data crosses from the down copy's last stage to the up copy's first
    assert not any(s.stage_index == p - 1 and s.type is pp.MetaStepType.FWD_HANDOFF for s in sched.local_order)
    rng = np.random.default_rng(p)
    x = ms.Tensor(rng.standard_normal((2 * m, 8)).astype(np.float32))
    y = ms.Tensor(rng.standard_normal((2 * m, 8)).astype(np.float32))
    loss = sched.run(x, y, mode=mode)
    # the up copy was given the down copy's weights when the runtime was built
    for k in range(p):
        for a, b in zip(stages[k].params, stages[p + k].params):
            np.testing.assert_array_equal(a.asnumpy(), b.asnumpy())

    whole = nn.SequentialCell(layers)
    params = whole.trainable_params()
    value, grads = ms.value_and_grad(lambda a, b: mse(whole(a), b), None, params)(x, y)
    np.testing.assert_allclose(float(loss.asnumpy()), float(value.asnumpy()), rtol=1e-5)
    per_stage = len(params) // p
    for k in range(p):
        ref = [g.asnumpy() for g in grads[k * per_stage:(k + 1) * per_stage]]
        for copy in (stages[k], stages[p + k]):     # both copies hold the sum over the copies
            assert len(copy.grads) == len(ref)
            for got, want in zip(copy.grads, ref):
                err = np.abs(got.asnumpy() - want).max() / np.abs(want).max()
                assert err <= 1e-5, (mode, k, copy.stage_index, err)


def test_dualpipe_routes_reach_validator_communication_and_runtime_checks():
    """Routes are data the validator, add_communication and the lowering follow; the stage ending the down
    route needs a loss; bad sizes are refused naming the value and what is valid."""
    from mindformers_core.pipeline.stage import StageInfo, stages_of_rank
    p, m = 4, 8
    for r in range(p):
        sched = pp.ScheduleDualPipe(stages_of_rank(r, p, 2, "v"), m)
        assert {s.stage_index for s in sched.local_order} == {r, 2 * p - 1 - r}
        for s in sched.local_order:       # no transfer leaves a route
            if s.type.is_p2p:
                assert s.neighbour_stage in sched.routes[s.micro_index]
    # the exec order with its sends and receives replays under blocking send/recv (simulate follows the
    # routes) in the makespan of the compute order with free communication
    assert pp.simulate(sched, 1.0, 2.0).makespan == pp.simulate_dualpipe(p, m, 1.0, 2.0).makespan == 26.0
    order = {r: list(v) for r, v in sched.exec_order.items()}
    order[p - 1].append(pp.MetaStep(0, pp.MetaStepType.FWD_SEND, p - 1))
    with pytest.raises(pp.ScheduleError, match=r"talks to stage 4, which is not on microbatch 0's route"):
        pp.validate_schedule(order, 2 * p, m, "v", routes=sched.routes)
    order = {r: list(v) for r, v in sched.exec_order.items()}
    order[0].append(pp.MetaStep(0, pp.MetaStepType.FWD, 7))
    with pytest.raises(pp.ScheduleError, match=r"microbatch 0 runs the route of stages 0..3, not stage 7"):
        pp.validate_schedule(order, 2 * p, m, "v", routes=sched.routes)
    with pytest.raises(ValueError, match=r"ScheduleDualPipe: stage 1 is the last stage of a route"):
        pp.ScheduleDualPipe([PipelineStage(nn.Dense(2, 2), 1, 4), PipelineStage(nn.Dense(2, 2), 2, 4)], 4)
    for stages, m_bad, text in (([StageInfo(0, 6), StageInfo(5, 6)], 6, "pp_size=3 must be even"),
                                ([StageInfo(0, 4), StageInfo(3, 4)], 3, "micro_batch_num=3 must be even"),
                                ([StageInfo(0, 4)], 4, "got 1 stage")):
        with pytest.raises(ValueError, match=text):
            pp.ScheduleDualPipe(stages, m_bad)
