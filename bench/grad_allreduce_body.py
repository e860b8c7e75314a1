"""msrun worker body of bench/grad_allreduce.py: the trainer's data-parallel gradient all-reduce alone."""
import time

import numpy as np
import mindspore as ms
from mindspore import Tensor, nn

from mindformers_core.common.graphs import compile_blocking
from mindformers_core.distributed.comm import kernels as K
from mindformers_core.distributed.process_group import world_group


def llama_grad_shapes():
    """The gradient shapes of bench/trainer.py's Llama (its plain-MindSpore twin has the same parameters:
    39 tensors, 4.72M floats)."""
    from bench.trainer import plain_model
    return [tuple(p.shape) for p in plain_model()[0].trainable_params()]


class PerTensorAllReduce(nn.Cell):
    """One sum all-reduce per gradient, as GradientReducer does over dp inside the trainer's jit step."""

    def __init__(self, group, n):
        super().__init__()
        self.reduce = nn.CellList([K.AllReduceKernel(group, "sum") for _ in range(n)])
        self.n = n

    def construct(self, grads):
        out = ()
        for i in range(self.n):
            out = out + (self.reduce[i](grads[i]),)
        return out


def run(steps=8):
    group = world_group()
    shapes = llama_grad_shapes()
    grads = ms.mutable(tuple(Tensor(np.random.default_rng(i).standard_normal(s).astype(np.float32))
                             for i, s in enumerate(shapes)))
    reduce = PerTensorAllReduce(group, len(shapes))

    def all_reduce(gs):
        return reduce(gs)
    out = {"floats": int(sum(int(np.prod(s)) for s in shapes)), "tensors": len(shapes)}
    for name, fn in (("blocking", compile_blocking(all_reduce)), ("jit", ms.jit(all_reduce))):
        fn(grads)[0].asnumpy()          # compile
        times = []
        for _ in range(steps):
            t0 = time.perf_counter()
            done = fn(grads)
            done[0].asnumpy(), done[-1].asnumpy()
            times.append(time.perf_counter() - t0)
        out[name] = times
    return out
