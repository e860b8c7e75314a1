"""Worker side of bench/hsdp.py: per-rank bytes held and step time of hsdp configurations."""
import time

import numpy as np
import mindspore as ms
from mindspore import Tensor, nn

from mindformers_core.distributed import get_env
from mindformers_core.hsdp import hsdp, zero_bytes
from mindformers_core.optim import AdamW


class MLP(nn.Cell):
    """``layers`` GELU MLP blocks (width -> 4 width -> width) with residuals, like a decoder's FFNs."""

    def __init__(self, width, layers):
        super().__init__()
        ms.set_seed(0)
        self.blocks = nn.CellList([nn.SequentialCell(nn.Dense(width, 4 * width), nn.GELU(approximate=True),
                                                     nn.Dense(4 * width, width)) for _ in range(layers)])

    def construct(self, x):
        for block in self.blocks:
            x = x + block(x)
        return x


class Loss(nn.Cell):
    def __init__(self, net):
        super().__init__(auto_prefix=False)
        self.net = net

    def construct(self, x, y):
        return ((self.net(x) - y) ** 2).mean()


def _nbytes(tensors):
    return int(sum(t.nbytes for t in tensors))


def measure(level, shard_size, mode, width, layers, batch, threshold, warmup, steps):
    env = get_env()
    rng = np.random.default_rng(env.rank)
    x = Tensor(rng.standard_normal((batch, width)).astype(np.float32))
    y = Tensor(rng.standard_normal((batch, width)).astype(np.float32))
    wrapped = hsdp(MLP(width, layers), shard_size=shard_size, threshold=threshold, optimizer_level=level)
    opt = AdamW(wrapped.trainable_params(), 1e-4)
    step = wrapped.train_step(Loss(wrapped), opt, mode=mode)
    for _ in range(warmup):
        step(x, y).asnumpy()
    calls = wrapped.collective_count()
    if wrapped.units is not None:
        wrapped.units.reset_peak()
    start = time.perf_counter()
    for _ in range(steps):
        step(x, y).asnumpy()
    elapsed = (time.perf_counter() - start) / steps
    calls = (wrapped.collective_count() - calls) / steps
    # bytes held between steps
    params = wrapped.trainable_params()
    states = [s for i in range(len(opt.parameters)) for s in opt.state_of(i)]
    # gradients as the optimizer receives them (after the data-parallel reduction)
    grad_fn = ms.value_and_grad(Loss(wrapped), None, opt.parameters)
    with wrapped.unsharded():
        _, grads = grad_fn(x, y)
        reduced = wrapped.reduce_gradients(grads)
    plans = [wrapped.plan_of(p) for p in params]
    # parameter bytes at the step's peak: level3 holds the shards plus the unit being gathered
    gathered = wrapped.units.peak_held_bytes if wrapped.units is not None else 0
    return {"peak_params": _nbytes(params) + gathered, "full_params": int(sum(p.nbytes for p in plans)),
            "level": level, "shard_size": shard_size, "mode": mode, "step_s": elapsed,
            "collectives_per_step": calls,
            "measured": {"params": _nbytes(params), "grads": _nbytes(reduced), "optimizer": _nbytes(states)},
            "formula": zero_bytes(plans, level, shard_size),
            "formula_no_threshold": zero_bytes(plans, level, shard_size, ignore_threshold=True),
            "param_count": int(sum(p.numel for p in plans)),
            "sharded_fraction": sum(p.nbytes for p in plans if p.sharded) / sum(p.nbytes for p in plans)}


def run(configs, width, layers, batch, threshold, warmup, steps, threads=None):
    if threads:
        ms.device_context.cpu.op_tuning.threads_num(threads)
    return [measure(level, s, mode, width, layers, batch, threshold, warmup, steps)
            for level, s, mode in configs]
