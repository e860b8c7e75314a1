"""Differentiable wrappers: a forward kernel in ``construct`` and its adjoint in ``bprop``.

Cell ``bprop`` is what MindSpore honours both in PyNative and under ``ms.jit`` (``ast``), so one
definition serves both modes.
"""
from __future__ import annotations

from mindspore import nn, ops

from ..process_group import ProcessGroup
from . import kernels as K
from .kernels import CommCell


class Identity(CommCell):
    """``x`` unchanged: the backward of ``reduce_from_region`` as is; as a ``Differentiable``'s forward
    (``copy_to_region``) it is replaced by ``kernels.FreshCopy`` (``mode``: see ``kernels.passes_input_through``)."""
    mode = "identity"

    def construct(self, x):
        return x


class Differentiable(CommCell):
    """``y = forward(x)``, ``dx = backward(dy)``: the shape of every linear collective. A forward that passes
    its input through (a one-member group) gives a new value (``kernels.FreshCopy``)."""

    def __init__(self, forward: nn.Cell, backward: nn.Cell):
        super().__init__()
        self.forward_kernel = K.FreshCopy() if K.passes_input_through(forward) else forward
        self.backward_kernel = backward

    def construct(self, x):
        return self.forward_kernel(x)

    def bprop(self, x, out, dout):
        return (self.backward_kernel(dout),)


class AllReduceExtremum(CommCell):
    """All-reduce max/min; the gradient goes to the ranks holding the extremum, split evenly on ties."""

    def __init__(self, group: ProcessGroup, op: str):
        super().__init__()
        self.reduce = K.AllReduceKernel(group, op)
        if K.passes_input_through(self.reduce):
            self.reduce = K.FreshCopy()
        self.sum = K.AllReduceKernel(group, "sum")

    def construct(self, x):
        return self.reduce(x)

    def bprop(self, x, out, dout):
        hit = ops.equal(x, out).astype(dout.dtype)
        count = self.sum(hit)
        return (self.sum(dout) * hit / ops.maximum(count, ops.ones_like(count)),)


class Send(CommCell):
    """Forward sends ``x``; backward receives the gradient of ``x`` back from the receiver.

    Returns a zero scalar token: add it to the loss so the backward exchange happens.
    """

    def __init__(self, world: ProcessGroup, dst: int, shape, dtype):
        super().__init__()
        self.send = K.SendKernel(world, dst)
        self.grad_recv = K.RecvKernel(world, dst, shape, dtype)
        self.keep = K.KeepAlive()

    def construct(self, x):
        return self.keep(ops.zeros((), x.dtype), self.send(x))

    def bprop(self, x, out, dout):
        # receive only after the forward send (``out`` depends on it): ranks must stay in step
        return (self.grad_recv(self.keep(x, out)),)


class Recv(CommCell):
    """Forward receives a tensor shaped like ``like``; backward sends its gradient back to ``src``."""

    def __init__(self, world: ProcessGroup, src: int, shape, dtype):
        super().__init__()
        self.recv = K.RecvKernel(world, src, shape, dtype)
        self.grad_send = K.SendKernel(world, src)
        self.keep = K.KeepAlive()

    def construct(self, like):
        return self.recv(like)

    def bprop(self, like, out, dout):
        # send only after the forward receive: ``dout`` need not depend on it (d<y,w>/dy = w)
        sent = self.grad_send(self.keep(dout, out))
        return (self.keep(ops.zeros_like(like), sent),)
