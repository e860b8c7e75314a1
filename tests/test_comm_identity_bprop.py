"""MindSpore 2.10's graph mode and Cells with a custom ``bprop`` whose forward passes the input through.

Found through the grid's LoRA on Qwen3-MoE at tp2 (+SP) under jit: a boundary whose forward is a no-op and whose
backward is a collective (LoRA A's "make partial", a gradient-only all-reduce) gave wrong gradients to every
layer below it, once the graph also held the MoE router's ``assign_add`` counters. The same happens on one
process without any collective (below): a custom-bprop Cell returning its input unchanged, plus any side effect in
the graph, gives wrong upstream gradients under ``ms.jit`` while PyNative is right. Our gradient-only Cells
(``comm.autograd.Identity`` / ``Differentiable``, ``sharding.boundary.Redistribute``) therefore give a new value
in the forward (``comm.kernels.FreshCopy``)."""
import numpy as np
import mindspore as ms
import pytest
from mindspore import Parameter, Tensor, nn, ops

from mindformers_core.distributed.comm import autograd as A
from mindformers_core.distributed.comm.kernels import FreshCopy


class _Times3(nn.Cell):
    def construct(self, x):
        return x * 3.0


class _RawPassThrough(nn.Cell):
    """Identity forward, gradient x3: the shape MindSpore 2.10's jit gets wrong."""

    def construct(self, x):
        return x

    def bprop(self, x, out, dout):
        return (dout * 3.0,)


class _Layer(nn.Cell):
    def __init__(self, i, boundary):
        super().__init__()
        rng = np.random.default_rng(i)
        self.enter = boundary
        self.wq = Parameter(Tensor(rng.standard_normal((4, 4)).astype(np.float32)), name=f"wq{i}")
        self.wk = Parameter(Tensor(rng.standard_normal((4, 4)).astype(np.float32)), name=f"wk{i}")
        self.count = Parameter(Tensor(np.zeros((1,), np.float32)), name=f"count{i}", requires_grad=False)

    def construct(self, x):
        h = self.enter(x)
        y = x + ops.tanh(ops.matmul(h, self.wq)) * ops.sigmoid(ops.matmul(h, self.wk))
        return ops.depend(y, ops.assign_add(self.count, ops.ones((1,), ms.float32)))     # a counter, as MoE's


class _Net(nn.Cell):
    def __init__(self, make):
        super().__init__()
        self.l0, self.l1 = _Layer(0, make()), _Layer(1, make())

    def construct(self, x):
        return (self.l1(self.l0(x)) ** 2).sum()


def _gradients(make):
    net = _Net(make)
    params = net.trainable_params()
    step = ms.value_and_grad(net, None, params)
    x = Tensor(np.arange(8, dtype=np.float32).reshape(2, 4) / 8)
    eager = [g.asnumpy() for g in step(x)[1]]
    graph = [g.asnumpy() for g in ms.jit(step)(x)[1]]
    return [p.name for p in params], eager, graph


@pytest.mark.parametrize("make", [lambda: A.Differentiable(A.Identity(), _Times3()),
                                  lambda: A.Differentiable(FreshCopy(), _Times3())],
                         ids=["differentiable_identity", "fresh_copy"])
def test_our_gradient_only_cells_give_jit_the_pynative_gradients_beside_a_side_effect(make):
    names, eager, graph = _gradients(make)
    for name, a, b in zip(names, eager, graph):
        np.testing.assert_allclose(b, a, rtol=1e-6, atol=1e-6, err_msg=name)
    assert max(np.abs(g).max() for g in eager) > 0.1           # the gradients are not trivially zero


def test_mindspore_2_10_jit_gets_a_passing_through_custom_bprop_wrong_beside_a_side_effect():
    """The MindSpore fact FreshCopy works around (pinned mindspore==2.10.0). If this starts failing after a
    MindSpore upgrade, the fact no longer holds and FreshCopy's copy could go."""
    names, eager, graph = _gradients(_RawPassThrough)
    worst = max(float(np.abs(a - b).max()) for a, b in zip(eager, graph))
    assert worst > 0.1, f"jit now equals PyNative (worst difference {worst:.2e}): MindSpore fixed it"
