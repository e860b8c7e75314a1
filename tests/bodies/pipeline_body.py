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


def reference(steps):
    net = nn.SequentialCell(_layers())
    params = net.trainable_params()
    grad_fn = ms.value_and_grad(lambda x, y: loss_fn(net(x), y), None, params)
    losses = []
    for step in range(steps):
        loss, grads = grad_fn(*_data(step))
        losses.append(float(loss.asnumpy()))
        _sgd(params, grads)
    return losses, [p.asnumpy() for p in params]


SCHEDULES = {"gpipe": (pp.ScheduleGPipe, 1, None), "1f1b": (pp.Schedule1F1B, 1, None),
             "interleaved": (pp.ScheduleInterleaved1F1B, 2, "interleaved"),
             "zb_h1": (pp.ScheduleZeroBubbleH1, 1, None), "zbv": (pp.ScheduleZeroBubbleV, 2, "v")}


def run(schedule, mode, steps=3, micro_batch_num=4):
    env = get_env()
    cls, per_rank, placement = SCHEDULES[schedule]
    pp_size = env.world_size
    stage_num = pp_size * per_rank
    layers = _layers()
    per_stage = LAYERS // stage_num
    infos = pp.stages_of_rank(env.rank, pp_size, per_rank, placement or "interleaved")
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
