"""Worker side of the DualPipe msrun parity test: a 4-layer MLP (width 8) as p = world size model stages held
twice (DualPipe's down and up copies), trained for a few SGD steps with ScheduleDualPipe, against the same
model trained on the whole batch in one process (tests/test_pipeline_dualpipe_msrun.py compares)."""
import numpy as np
import mindspore as ms
from mindspore import Tensor, nn

from mindformers_core import pipeline as pp
from mindformers_core.distributed import get_env
from mindformers_core.pipeline.runtime import PipelineStage
from tests.bodies.pipeline_body import _sgd, loss_fn

LAYERS, WIDTH, BATCH = 4, 8, 8


def _layers(seed=0, scale=0.5):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(LAYERS):
        dense = nn.Dense(WIDTH, WIDTH, activation="tanh")
        dense.weight.set_data(Tensor(rng.standard_normal((WIDTH, WIDTH)).astype(np.float32) * scale))
        dense.bias.set_data(Tensor(rng.standard_normal((WIDTH,)).astype(np.float32) * 0.1))
        out.append(dense)
    return out


def _data(step):
    rng = np.random.default_rng(300 + step)
    return (Tensor(rng.standard_normal((BATCH, WIDTH)).astype(np.float32)),
            Tensor(rng.standard_normal((BATCH, WIDTH)).astype(np.float32)))


def reference(steps, data=_data):
    """The whole model trained on ``data(step)`` in this process: (losses, weights)."""
    net = nn.SequentialCell(_layers())
    params = net.trainable_params()
    grad_fn = ms.value_and_grad(lambda x, y: loss_fn(net(x), y), None, params)
    losses = []
    for step in range(steps):
        loss, grads = grad_fn(*data(step))
        losses.append(float(loss.asnumpy()))
        _sgd(params, grads)
    return losses, [p.asnumpy() for p in params]


def _copies(stages, r, p, per_stage):
    """This rank's weights per (copy, model layer, weight|bias): its down copy of model stage r and its up
    copy of model stage p-1-r."""
    params = {}
    for copy, model_stage, st in (("down", r, stages[0]), ("up", p - 1 - r, stages[1])):
        for k, prm in enumerate(st.params):
            params[(copy, model_stage * per_stage + k // 2, k % 2)] = prm.asnumpy()
    return params


def _result(losses, params, steps, data):
    ref_losses, ref_params = reference(steps, data)
    return {"losses": losses, "ref_losses": ref_losses, "params": params,
            "ref_params": {(i // 2, i % 2): v for i, v in enumerate(ref_params)}}


def run(modes, steps=2, micro_batch_num=4):
    """Rank r holds model stage r (down copy, stage index r) and a copy of model stage p-1-r (up copy,
    stage index 2p-1-r), built here with other weights than the model's: the runtime gives it the down copy's.
    Returns per mode the loss this rank reports each step, its weights per (copy, model layer, weight|bias),
    and the reference's."""
    env = get_env()
    p = env.world_size
    per_stage = LAYERS // p
    out = {}
    for mode in modes:
        layers = _layers()
        r = env.rank
        down = nn.SequentialCell(layers[r * per_stage:(r + 1) * per_stage])
        up_model_stage = p - 1 - r
        up = nn.SequentialCell(_layers(seed=99 + r)[:per_stage])     # not the model's weights
        stages = [PipelineStage(down, r, 2 * p, loss_fn=loss_fn if r == p - 1 else None),
                  PipelineStage(up, 2 * p - 1 - r, 2 * p, loss_fn=loss_fn if up_model_stage == p - 1 else None)]
        sched = pp.ScheduleDualPipe(stages, micro_batch_num)
        ends = r in (0, p - 1)
        losses = []
        for step in range(steps):
            x, y = _data(step)
            loss = sched.run(x if ends else None, y if ends else None, mode=mode)
            losses.append(None if loss is None else float(loss.asnumpy()))
            for st in stages:
                _sgd(st.params, st.grads)
        out[mode] = dict(_result(losses, _copies(stages, r, p, per_stage), steps, _data),
                         stages=[st.stage_index for st in stages])
    return out


def _global_data(step):
    rng = np.random.default_rng(400 + step)
    return (Tensor(rng.standard_normal((2 * BATCH, WIDTH)).astype(np.float32)),
            Tensor(rng.standard_normal((2 * BATCH, WIDTH)).astype(np.float32)))


def run_with_dp(modes, steps=2, micro_batch_num=4):
    """pp2 x dp2 on 4 ranks (parallel_state): each dp replica runs DualPipe on its half of a 16-row batch; the
    copies' gradients are summed over the mirror pair of its own replica, then averaged over dp."""
    from mindformers_core.distributed import parallel_state as ps
    ps.initialize_model_parallel(pipeline_model_parallel_size=2)
    pp_group, dp_group = ps.get_pipeline_model_parallel_group(), ps.get_data_parallel_group()
    r, p = ps.get_pipeline_model_parallel_rank(), 2
    per_stage = LAYERS // p
    out = {}
    for mode in modes:
        layers = _layers()
        down = nn.SequentialCell(layers[r * per_stage:(r + 1) * per_stage])
        up = nn.SequentialCell(_layers(seed=99 + get_env().rank)[:per_stage])
        stages = [PipelineStage(down, r, 2 * p, pp_ranks=list(pp_group.ranks), dp_group=dp_group,
                                loss_fn=loss_fn if r == p - 1 else None),
                  PipelineStage(up, 2 * p - 1 - r, 2 * p, pp_ranks=list(pp_group.ranks), dp_group=dp_group,
                                loss_fn=loss_fn if r == 0 else None)]
        sched = pp.ScheduleDualPipe(stages, micro_batch_num)
        lo, hi = dp_group.local_rank * BATCH, (dp_group.local_rank + 1) * BATCH
        losses = []
        for step in range(steps):
            x, y = _global_data(step)
            loss = sched.run(x[lo:hi], y[lo:hi], mode=mode)
            losses.append(float(loss.asnumpy()))
            for st in stages:
                _sgd(st.params, st.grads)
        out[mode] = dict(_result(losses, _copies(stages, r, p, per_stage), steps, _global_data),
                         pp=list(pp_group.ranks), dp=list(dp_group.ranks))
    ps.destroy_model_parallel()
    return out
