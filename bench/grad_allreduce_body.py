"""msrun worker body of bench/grad_allreduce.py: the trainer's data-parallel gradient all-reduce alone, the
CPU collective primitives on the same payload, and whether an all-reduce overlaps the backward."""
import time

import numpy as np
import mindspore as ms
from mindspore import Parameter, ParameterTuple, Tensor, nn, ops

from mindformers_core.common.graphs import compile_blocking
from mindformers_core.distributed.comm import autograd as A, kernels as K
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


class FlatAllReduce(nn.Cell):
    """The gradients concatenated into one tensor, one all-reduce, split back: one call instead of 39, two
    more copies of the payload."""

    def __init__(self, group, shapes):
        super().__init__()
        self.reduce = K.AllReduceKernel(group, "sum")
        self.shapes = [tuple(s) for s in shapes]
        self.sizes = [int(np.prod(s)) for s in shapes]

    def construct(self, grads):
        flat = ops.cat([g.reshape(-1) for g in grads])
        flat = self.reduce(flat)
        parts = ops.split(flat, self.sizes)
        out = ()
        for i in range(len(self.sizes)):
            out = out + (parts[i].reshape(self.shapes[i]),)
        return out


def _timed(fn, arg, steps):
    fn(arg)[0].asnumpy()          # compile
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        done = fn(arg)
        done[0].asnumpy(), done[-1].asnumpy()
        times.append(time.perf_counter() - t0)
    return times


def run(steps=8, rounds=10):
    group = world_group()
    shapes = llama_grad_shapes()
    grads = ms.mutable(tuple(Tensor(np.random.default_rng(i).standard_normal(s).astype(np.float32))
                             for i, s in enumerate(shapes)))
    reduce = PerTensorAllReduce(group, len(shapes))

    def all_reduce(gs):
        return reduce(gs)
    out = {"floats": int(sum(int(np.prod(s)) for s in shapes)), "tensors": len(shapes)}
    flat = FlatAllReduce(group, shapes)

    def flat_all_reduce(gs):
        return flat(gs)
    for name, fn in (("blocking", compile_blocking(all_reduce)), ("jit", ms.jit(all_reduce)),
                     ("flat", compile_blocking(flat_all_reduce))):
        out[name] = _timed(fn, grads, steps)
    out["primitives"] = primitives(out["floats"], steps)
    out["overlap"] = overlap(rounds)
    return out


# ---- the same payload through each CPU collective MindSpore has (one flat float32 tensor) ---------------
class _FlatAllReduce(nn.Cell):
    def __init__(self):
        super().__init__()
        self.op = ops.AllReduce()

    def construct(self, x):
        return (self.op(x),)


class _AllGatherSum(nn.Cell):
    def __init__(self, size):
        super().__init__()
        self.op = ops.AllGather()
        self.size = size

    def construct(self, x):
        return (self.op(x.reshape(1, -1)).reshape(self.size, -1).sum(0),)


class _Broadcast(nn.Cell):      # one direction only: a lower bound for anything that moves the payload
    def __init__(self):
        super().__init__()
        self.op = ops.Broadcast(0)

    def construct(self, x):
        return self.op((x,))


def primitives(floats, steps):
    """Seconds per call of a flat all-reduce, all-gather + local sum, and broadcast from rank 0 of ``floats``
    float32 values on the world group (compile_blocking)."""
    x = Tensor(np.random.default_rng(0).standard_normal((floats,)).astype(np.float32))
    cells = {"all_reduce": _FlatAllReduce(), "all_gather_sum": _AllGatherSum(world_group().size),
             "broadcast": _Broadcast()}
    return {name: _timed(compile_blocking(cell), x, steps) for name, cell in cells.items()}


# ---- does an all-reduce issued inside the backward overlap the rest of it? ---------------------------------
class _MLP(nn.Cell):
    """``layers`` tanh layers of width ``width``: 5 x 1000 x 1000 = 5.0M floats, the Llama's 4.72M."""

    def __init__(self, layers, width, group, hooks):
        super().__init__()
        rng = np.random.default_rng(0)
        self.ws = ParameterTuple([Parameter(Tensor((rng.standard_normal((width, width)) / np.sqrt(width))
                                                   .astype(np.float32)), name=f"w{i}") for i in range(layers)])
        # identity forward, all-reduce of the gradient in the backward (comm.copy_to_region's pair), one per
        # layer: a DDP-style gradient hook, each layer's all-reduce issued as soon as its gradient exists
        self.hooks = nn.CellList([A.Differentiable(A.Identity(), K.AllReduceKernel(group, "sum"))
                                  for _ in range(layers)]) if hooks else None
        self.layers = layers

    def construct(self, x):
        for i in range(self.layers):
            w = self.ws[i] if self.hooks is None else self.hooks[i](self.ws[i])
            x = ops.tanh(ops.matmul(x, w))
        return (x * x).mean()


OVERLAP_MODES = ("compute", "reduce_only", "reduce_after", "reduce_in_backward")


def _overlap_step(grad_fn, reduce):
    def step(x):
        loss, grads = grad_fn(x)
        if reduce is not None:
            grads = reduce(grads)
        return loss, grads
    return step


def _reduce_fn(reduce):
    def reduce_only(grads):
        return reduce(grads)
    return reduce_only


def overlap(rounds=10, layers=5, width=1000, batch=768):
    """Seconds per call of each mode, the modes interleaved round by round (so drift hits all alike):
    ``compute`` (loss and gradients), ``reduce_only`` (the all-reduce of 5 such gradients), ``reduce_after``
    (gradients, then the all-reduce, one graph: the trainer's dp step), ``reduce_in_backward`` (each layer's
    all-reduce issued from the backward as soon as its gradient exists); plus each mode's first gradient
    summed, to check that the reducing modes agree."""
    group = world_group()
    x = Tensor(np.random.default_rng(1).standard_normal((batch, width)).astype(np.float32))
    calls, check = {}, {}
    for mode in OVERLAP_MODES:
        net = _MLP(layers, width, group, hooks=mode == "reduce_in_backward")
        grad_fn = ms.value_and_grad(net, None, net.trainable_params())
        reduce = PerTensorAllReduce(group, layers)
        if mode == "reduce_only":
            grads = ms.mutable(tuple(Tensor(np.ones((width, width), np.float32)) for _ in range(layers)))
            fn, arg = compile_blocking(_reduce_fn(reduce)), grads
        else:
            fn = compile_blocking(_overlap_step(grad_fn, reduce if mode == "reduce_after" else None))
            arg = x
        calls[mode] = (fn, arg)
        first = fn(arg)
        if mode in ("reduce_after", "reduce_in_backward"):
            check[mode] = float(first[1][0].asnumpy().sum())
    times = {m: [] for m in OVERLAP_MODES}
    for _ in range(rounds):
        for mode in OVERLAP_MODES:
            fn, arg = calls[mode]
            t0 = time.perf_counter()
            done = fn(arg)
            (done[-1] if mode == "reduce_only" else done[1][-1]).asnumpy()
            times[mode].append(time.perf_counter() - t0)
    return {"times": times, "first_gradient_sum": check}
