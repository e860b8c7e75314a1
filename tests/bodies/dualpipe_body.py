"""Worker side of the DualPipe msrun parity test: a 4-layer MLP (width 8) as p = world size model stages held
twice (DualPipe's down and up copies), trained for a few SGD steps with ScheduleDualPipe, against the same
model trained on the whole batch in one process (tests/test_pipeline_dualpipe_msrun.py compares)."""
import numpy as np
import mindspore as ms
from mindspore import Tensor, nn, ops

from mindformers_core import pipeline as pp
from mindformers_core.distributed import get_env
from mindformers_core.pipeline.runtime import PipelineStage

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


def loss_fn(out, label):
    return ((out - label) ** 2).mean()


def _data(step):
    rng = np.random.default_rng(300 + step)
    return (Tensor(rng.standard_normal((BATCH, WIDTH)).astype(np.float32)),
            Tensor(rng.standard_normal((BATCH, WIDTH)).astype(np.float32)))


def _sgd(params, grads, lr=0.1):
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
        params = {}
        for copy, model_stage, st in (("down", r, stages[0]), ("up", up_model_stage, stages[1])):
            for k, prm in enumerate(st.params):
                params[(copy, model_stage * per_stage + k // 2, k % 2)] = prm.asnumpy()
        ref_losses, ref_params = reference(steps)
        out[mode] = {"losses": losses, "ref_losses": ref_losses, "params": params,
                     "ref_params": {(i // 2, i % 2): v for i, v in enumerate(ref_params)},
                     "stages": [st.stage_index for st in stages]}
    return out
