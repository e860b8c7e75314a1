"""Worker side of the hsdp parity tests: a small MLP trained for a few AdamW steps with hsdp at
every level and shard size, in PyNative and ms.jit; the parent compares with one process
training the same model on the global batch."""
import time

import numpy as np
import mindspore as ms
from mindspore import Tensor, nn

from mindformers_core.distributed import get_env
from mindformers_core.hsdp import hsdp
from mindformers_core.optim import AdamW, CosineWithWarmUpLR, clip_grad_norm

# 3 steps (5 until the suite had to fit 20 minutes): AdamW moments and the shards carry over two step
# boundaries, the warm-up and cosine decay are both crossed. The accumulation and clipping configs run 3
# too: with 2, the clipped run's last loss equals the unclipped one (measured 2.40703988 vs 2.40703964:
# AdamW undoes a uniform gradient scale at its first step), so the test could not see clipping act
IN, HIDDEN, OUT, GLOBAL_BATCH, STEPS = 16, 64, 6, 16, 3
SHORT = 3   # steps of the accumulation and clipping configs
THRESHOLD_KB = 1   # W1 (64x16, 4 KB) and W2 (6x64, 1.5 KB) are sharded, the biases are not


class MLP(nn.Cell):
    def __init__(self):
        super().__init__()
        rng = np.random.default_rng(0)
        self.fc1 = nn.Dense(IN, HIDDEN, activation="tanh")
        self.fc2 = nn.Dense(HIDDEN, OUT)
        for dense, scale in ((self.fc1, 0.3), (self.fc2, 0.2)):
            dense.weight.set_data(Tensor(rng.standard_normal(dense.weight.shape).astype(np.float32) * scale))
            dense.bias.set_data(Tensor(rng.standard_normal(dense.bias.shape).astype(np.float32) * 0.1))

    def construct(self, x):
        return self.fc2(self.fc1(x))


class Loss(nn.Cell):
    def __init__(self, net):
        super().__init__(auto_prefix=False)
        self.net = net

    def construct(self, x, y):
        return ((self.net(x) - y) ** 2).mean()


def data(step):
    rng = np.random.default_rng(100 + step)
    return (rng.standard_normal((GLOBAL_BATCH, IN)).astype(np.float32),
            rng.standard_normal((GLOBAL_BATCH, OUT)).astype(np.float32))


def optimizer(params):
    return AdamW(params, CosineWithWarmUpLR(0.02, warmup_steps=1, total_steps=STEPS), betas=(0.9, 0.99),
                 eps=1e-8, weight_decay=0.01)


def reference(steps=STEPS, max_grad_norm=None):
    """One process, global batch."""
    net = MLP()
    opt = optimizer(net.trainable_params())
    grad_fn = ms.value_and_grad(Loss(net), None, opt.parameters)
    losses = []
    for s in range(steps):
        x, y = data(s)
        loss, grads = grad_fn(Tensor(x), Tensor(y))
        if max_grad_norm is not None:
            grads, _ = clip_grad_norm(grads, max_grad_norm)
        opt(grads)
        losses.append(float(loss.asnumpy()))
    return losses, {p.name: p.asnumpy() for p in net.trainable_params()}


def train(level, shard_size, mode, accumulate=1, max_grad_norm=None, steps=STEPS):
    env = get_env()
    dp, rank = env.world_size, env.rank
    net = MLP()
    wrapped = hsdp(net, shard_size=shard_size, threshold=THRESHOLD_KB, optimizer_level=level,
                   accumulate_grad_step=accumulate)
    opt = optimizer(wrapped.trainable_params())
    if mode == "manual":   # the PyNative pair: gradients, reduce_gradients, apply_gradients
        grad_fn = ms.value_and_grad(Loss(wrapped), None, opt.parameters)

        def step(x, y):
            loss, grads = grad_fn(x, y)
            wrapped.apply_gradients(wrapped.reduce_gradients(grads, opt.parameters), opt)
            return loss   # this rank's loss (the test compares the weights)
    else:
        step = wrapped.train_step(Loss(wrapped), opt, mode=mode, max_grad_norm=max_grad_norm)
    seen = _probe_level3(net, wrapped) if level == "level3" else []
    rows = GLOBAL_BATCH // dp
    losses, held, counts, saved_left = [], [], [], []
    for s in range(steps):
        x, y = data(s)
        x, y = x[rank * rows:(rank + 1) * rows], y[rank * rows:(rank + 1) * rows]
        micro_rows = rows // accumulate
        before = wrapped.collective_count()
        per_micro = []
        for m in range(accumulate):
            sl = slice(m * micro_rows, (m + 1) * micro_rows)
            loss = step(Tensor(x[sl]), Tensor(y[sl]))
            after = wrapped.collective_count()
            per_micro.append(after - before)
            before = after
        counts.append(per_micro)
        losses.append(float(loss.asnumpy()))
        # the data's shape (``p.shape`` is Python-side and can disagree with it)
        held.append({p.name: p.asnumpy().shape for p in wrapped.trainable_params()})
        saved_left.append(len(wrapped.units.saved_shards) if wrapped.units is not None else 0)
    peak = wrapped.units.peak_held_bytes if wrapped.units is not None else None
    plans = {p.name: (wrapped.plan_of(p).sharded, wrapped.plan_of(p).shard_shape)
             for p in wrapped.trainable_params()}
    state_shapes = {s.name: tuple(s.shape) for i in range(len(opt.parameters)) for s in opt.state_of(i)}
    param_bytes = sum(p.nbytes for p in wrapped.trainable_params())
    return {"losses": losses, "params": wrapped.gather_full_params(), "held": held, "plans": plans,
            "counts": counts, "saved_shards_left": saved_left, "state_shapes": state_shapes,
            "param_bytes": param_bytes,
            "describe": wrapped.describe(), "seen": seen, "peak_held_bytes": peak}


def _probe_level3(net, wrapped):
    """Record the real shapes of the weights whenever fc1 or fc2 (or their jit islands) starts
    its forward or its backward: hooks registered after hsdp's run after its gather."""
    seen = []
    weights = {"fc1": net.fc1.weight, "fc2": net.fc2.weight}

    def probe(unit, phase):
        def hook(cell, *args):
            seen.append((unit, phase, {k: tuple(w.shape) for k, w in weights.items()}))
        return hook
    for unit in ("fc1", "fc2"):
        cell = getattr(net, unit)
        cell.register_forward_pre_hook(probe(unit, "forward"))
        cell.register_backward_pre_hook(probe(unit, "backward"))
    return seen


def run(configs):
    """``configs``: list of [level, shard_size, mode, accumulate, max_grad_norm]."""
    out = {}
    for level, shard_size, mode, accumulate, clip in configs:
        start = time.perf_counter()
        steps = STEPS if (accumulate == 1 and clip is None) else SHORT
        result = train(level, shard_size, mode, accumulate, clip, steps)
        result["seconds"] = time.perf_counter() - start
        out[(level, shard_size, mode, accumulate, clip)] = result
    return out
