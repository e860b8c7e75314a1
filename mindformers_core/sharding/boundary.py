"""Run a sharding plan: redistributions at Cell boundaries, each with its own backward.

A :class:`Redistribute` Cell executes the forward plan and, in ``bprop``, the backward plan the
propagation pass derived (gradient arriving in the target layout, partial where the consumer
split the computation, converted back to the source layout). Because the conversions are plain
Cells calling the collectives, the same plan runs in PyNative and under ``ms.jit``.
:class:`ShardedCall` wraps a sub-Cell with the conversions of its inputs and outputs;
:func:`wrap_root` gives the model itself the same treatment by swapping its class for a subclass,
so ``parallelize`` returns the very object it was given.
"""
from __future__ import annotations

from typing import Optional, Sequence

from mindspore import nn, ops

from ..distributed.comm import kernels as K
from ..distributed.comm.functional import cached_comm_cell
from ..distributed.comm.kernels import CommCell
from ..distributed.env import get_env
from .dtensor import _KeepOnFirst, device_mesh_of
from .redistribution import RedistributionPlan


def plan_kernels(plan: RedistributionPlan, rank: int):
    """The plan's steps as raw collective Cells for this rank (shared through the comm cache),
    built in Python so that a compiled graph only sees a fixed sequence of Cell calls."""
    cells = []
    mesh = device_mesh_of(plan.source)
    for step in plan.steps:
        if step.kind == "p2p":
            raise ValueError(f"a Cell-boundary redistribution cannot cross meshes ({plan.source!r} -> "
                             f"{plan.target!r}); pipeline stages hand tensors over in the pipeline runtime")
        g = mesh.get_group(step.axis)
        if step.kind == "all_reduce":
            cell = cached_comm_cell(("raw_all_reduce", g.ranks, step.op), lambda: K.AllReduceKernel(g, step.op))
        elif step.kind == "all_gather":
            cell = cached_comm_cell(("raw_all_gather", g.ranks, step.dim), lambda: K.AllGatherKernel(g, step.dim))
        elif step.kind == "reduce_scatter":
            cell = cached_comm_cell(("raw_reduce_scatter", g.ranks, step.dim),
                                    lambda: K.ReduceScatterKernel(g, step.dim))
        elif step.kind == "all_to_all":
            cell = cached_comm_cell(("raw_all_to_all", g.ranks, step.dim_to, step.dim),
                                    lambda: K.AllToAllKernel(g, step.dim_to, step.dim))
        elif step.kind == "slice":
            cell = cached_comm_cell(("raw_split", g.ranks, step.dim), lambda: K.SplitKernel(g, step.dim))
        elif step.kind == "zero_partial":
            first = g.local_rank == 0
            cell = cached_comm_cell(("keep_on_first", g.ranks, first), lambda: _KeepOnFirst(first))
        else:
            raise ValueError(f"unknown redistribution step {step.kind!r}")
        cells.append(cell)
    return cells


class _Steps(CommCell):
    def __init__(self, cells):
        super().__init__()
        self.kernels = nn.CellList(cells)
        self.count = len(cells)

    def construct(self, x):
        for i in range(self.count):
            x = self.kernels[i](x)
        return x


class Redistribute(CommCell):
    """``y = forward_plan(x)``; ``dx = scale * backward_plan(dy)``."""

    def __init__(self, forward: RedistributionPlan, backward: Optional[RedistributionPlan],
                 scale: float = 1.0, name: str = ""):
        super().__init__()
        rank = get_env().rank
        self.forward_plan = forward
        self.backward_plan = backward
        # a forward with no step gives a new value, not x itself (kernels.FreshCopy: MindSpore 2.10's jit)
        self.forward_steps = _Steps(plan_kernels(forward, rank)) if forward.steps else K.FreshCopy()
        self.has_backward = backward is not None
        self.backward_steps = _Steps(plan_kernels(backward, rank) if backward is not None else [])
        self.scale = float(scale)
        self.scaled = self.scale != 1.0
        self.name = name

    def construct(self, x):
        return self.forward_steps(x)

    def bprop(self, x, out, dout):
        if not self.has_backward:
            return (ops.zeros_like(x),)
        dx = self.backward_steps(dout)
        if self.scaled:
            dx = dx * self.scale
        return (dx,)


class Passthrough(CommCell):
    def construct(self, x):
        return x


def inner_attribute(self, name):
    """``__getattr__`` of a Cell wrapping another as ``self.inner``: the wrapped Cell's attributes
    stay reachable (``model.decoder.layer_numbers``). Private names are not forwarded: they are the wrapper's
    own Cell state (MindSpore's ``Cell.recompute`` asks ``hasattr(self, '_recompute_cell')`` of the wrapper
    and refused to recompute a wrapped layer when the answer came from the inner Cell)."""
    try:
        return nn.Cell.__getattr__(self, name)
    except AttributeError:
        cells = self.__dict__.get("_cells")
        if cells is None or "inner" not in cells or name.startswith("_"):
            raise
        return getattr(cells["inner"], name)


class ShardedCall(CommCell):
    """Calls ``inner`` with its tensor arguments redistributed and its outputs redistributed."""

    def __init__(self, inner: nn.Cell, pre: Sequence[nn.Cell], post: Sequence[nn.Cell], single_output: bool):
        super().__init__()
        self.inner = inner
        self.pre = nn.CellList(list(pre))
        self.post = nn.CellList(list(post))
        self.n_pre = len(pre)
        self.n_post = len(post)
        self.single_output = single_output

    __getattr__ = inner_attribute

    def construct(self, *args):
        new_args = ()
        for i in range(self.n_pre):
            new_args = new_args + (self.pre[i](args[i]),)
        out = self.inner(*new_args)
        if self.single_output:
            return self.post[0](out)
        result = ()
        for i in range(self.n_post):
            result = result + (self.post[i](out[i]),)
        return result


def _root_class(base: type) -> type:
    class Parallelized(base):
        def construct(self, *args):
            new_args = ()
            for i in range(self.mfc_root_call.n_pre):
                new_args = new_args + (self.mfc_root_call.pre[i](args[i]),)
            out = base.construct(self, *new_args)
            if self.mfc_root_call.single_output:
                return self.mfc_root_call.post[0](out)
            result = ()
            for i in range(self.mfc_root_call.n_post):
                result = result + (self.mfc_root_call.post[i](out[i]),)
            return result

    Parallelized.__name__ = f"Parallelized{base.__name__}"
    Parallelized.__qualname__ = Parallelized.__name__
    return Parallelized


class _RootConversions(CommCell):
    def __init__(self, pre, post, single_output):
        super().__init__()
        self.pre = nn.CellList(list(pre))
        self.post = nn.CellList(list(post))
        self.n_pre = len(pre)
        self.n_post = len(post)
        self.single_output = single_output


def wrap_root(model: nn.Cell, pre: Sequence[nn.Cell], post: Sequence[nn.Cell], single_output: bool) -> None:
    """Give ``model`` (in place) the conversions of its own inputs and outputs."""
    names = {id(p): p.name for p in model.get_parameters()}
    model.mfc_root_call = _RootConversions(pre, post, single_output)
    model.__class__ = _root_class(type(model))
    for p in model.get_parameters():
        p.name = names.get(id(p), p.name)
