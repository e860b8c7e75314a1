"""Worker side of the pipeline runtime parity tests: a 4-layer MLP split into stages, trained for
a few SGD steps with a schedule, against the same model trained on the whole batch in-process."""
import numpy as np
import mindspore as ms
from mindspore import Tensor, nn, ops

from mindformers_core.distributed import get_env
from mindformers_core import pipeline as pp
from mindformers_core.pipeline.runtime import PipelineStage

LAYERS, WIDTH, BATCH = 8, 16, 8


def _layers(seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(LAYERS):
        dense = nn.Dense(WIDTH, WIDTH, activation="tanh")
        dense.weight.set_data(Tensor(rng.standard_normal((WIDTH, WIDTH)).astype(np.float32) * 0.4))
        dense.bias.set_data(Tensor(rng.standard_normal((WIDTH,)).astype(np.float32) * 0.1))
        out.append(dense)
    return out


def loss_fn(out, label):
    return ((out - label) ** 2).mean()


def _data(step):
    rng = np.random.default_rng(100 + step)
    return (Tensor(rng.standard_normal((BATCH, WIDTH)).astype(np.float32)),
            Tensor(rng.standard_normal((BATCH, WIDTH)).astype(np.float32)))


def _sgd(params, grads, lr=0.1):
    # in place: a compiled graph keeps the buffer it captured, so set_data/assign_value
    # (which swap the buffer) would leave ms.jit stages training stale weights
    for p, g in zip(params, grads):
        ops.assign(p, p - lr * g)


def reference(steps, data=None):
    net = nn.SequentialCell(_layers())
    params = net.trainable_params()
    grad_fn = ms.value_and_grad(lambda x, y: loss_fn(net(x), y), None, params)
    losses = []
    for step in range(steps):
        loss, grads = grad_fn(*(data or _data)(step))
        losses.append(float(loss.asnumpy()))
        _sgd(params, grads)
    return losses, [p.asnumpy() for p in params]


SCHEDULES = pp.BUILTIN_SCHEDULES


def run(schedule, mode, steps=3, micro_batch_num=4):
    env = get_env()
    cls, per_rank, placement = SCHEDULES[schedule]
    pp_size = env.world_size
    stage_num = pp_size * per_rank
    layers = _layers()
    per_stage = LAYERS // stage_num
    infos = pp.stages_of_rank(env.rank, pp_size, per_rank, placement)
    stages = [PipelineStage(nn.SequentialCell(layers[i.stage_index * per_stage:(i.stage_index + 1) * per_stage]),
                            i.stage_index, stage_num, loss_fn=loss_fn) for i in infos]
    sched = cls(stages[0], micro_batch_num) if per_rank == 1 else cls(stages, micro_batch_num)
    held = {st.stage_index for st in stages}
    losses = []
    for step in range(steps):
        x, y = _data(step)
        loss = sched.run(x if 0 in held else None, y if stage_num - 1 in held else None, mode=mode)
        losses.append(None if loss is None else float(loss.asnumpy()))
        for st in stages:
            _sgd(st.params, st.grads)
    ref_losses, ref_params = reference(steps)
    mine = {}
    for st in stages:
        for k, p in enumerate(st.params):
            layer = st.stage_index * per_stage + k // 2
            mine[(layer, k % 2)] = p.asnumpy()
    return {"losses": losses, "ref_losses": ref_losses, "params": mine,
            "ref_params": {(i // 2, i % 2): p for i, p in enumerate(ref_params)},
            "stages": [st.stage_index for st in stages]}


def run_all(schedules, modes, steps=3, micro_batch_num=4):
    return {(name, mode): run(name, mode, steps, micro_batch_num) for name in schedules for mode in modes}


def run_with_dp(schedule, modes, steps=3, micro_batch_num=4):
    """pp2 x dp2 on 4 ranks via parallel_state; each dp replica trains on half of a 16-row batch."""
    from mindformers_core.distributed import parallel_state as ps
    ps.initialize_model_parallel(pipeline_model_parallel_size=2)
    pp_group, dp_group = ps.get_pipeline_model_parallel_group(), ps.get_data_parallel_group()
    cls = SCHEDULES[schedule][0]
    out = {}
    for mode in modes:
        layers = _layers()
        rank = ps.get_pipeline_model_parallel_rank()
        per_stage = LAYERS // 2
        stage = PipelineStage(nn.SequentialCell(layers[rank * per_stage:(rank + 1) * per_stage]), rank, 2,
                              pp_ranks=list(pp_group.ranks), loss_fn=loss_fn, dp_group=dp_group)
        sched = cls(stage, micro_batch_num)
        losses = []
        lo, hi = dp_group.local_rank * BATCH, (dp_group.local_rank + 1) * BATCH
        for step in range(steps):
            x, y = _global_data(step)
            loss = sched.run(x[lo:hi] if rank == 0 else None, y[lo:hi] if rank == 1 else None, mode=mode)
            losses.append(None if loss is None else float(loss.asnumpy()))
            _sgd(stage.params, stage.grads)
        ref_losses, ref_params = reference(steps, data=_global_data)
        out[mode] = {"losses": losses, "ref_losses": ref_losses, "stage": rank,
                     "dp": list(dp_group.ranks), "pp": list(pp_group.ranks),
                     "params": {(rank * per_stage + k // 2, k % 2): p.asnumpy() for k, p in enumerate(stage.params)},
                     "ref_params": {(i // 2, i % 2): p for i, p in enumerate(ref_params)}}
    ps.destroy_model_parallel()
    return out


def _global_data(step):
    rng = np.random.default_rng(200 + step)
    return (Tensor(rng.standard_normal((2 * BATCH, WIDTH)).astype(np.float32)),
            Tensor(rng.standard_normal((2 * BATCH, WIDTH)).astype(np.float32)))


def run_stalled(timeout=8.0):
    """Stage 0's rank never sends (it sleeps); stage 1's runtime must report who it waited for."""
    import time as _time
    env = get_env()
    layers = _layers()
    if env.rank == 0:
        _time.sleep(120)          # stalled peer: killed by the harness once rank 1 reports
        return {"rank": 0}
    stage = PipelineStage(nn.SequentialCell(layers[LAYERS // 2:]), 1, 2, loss_fn=loss_fn)
    sched = pp.Schedule1F1B(stage, 2)
    sched.runtime("pynative").timeout = timeout
    x, y = _data(0)
    sched.run(None, y, mode="pynative")
    return {"rank": 1, "finished": True}
