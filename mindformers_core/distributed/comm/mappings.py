"""The autograd pairs tensor and sequence parallel layers are built from (Megatron's mappings).

Each pairs a forward collective with the backward that keeps gradients right when the
surrounding computation is replicated (or split) over the tensor-parallel group:

=========================================  ======================  ========================
function                                   forward                 backward
=========================================  ======================  ========================
copy_to_region                             identity                all-reduce
reduce_from_region                         all-reduce              identity
scatter_to_region(dim=-1)                  keep own slice          all-gather
gather_from_region(dim=-1)                 all-gather              keep own slice
scatter_to_sequence_parallel_region(0)     keep own slice          all-gather
gather_from_sequence_parallel_region(0)    all-gather              reduce-scatter
reduce_scatter_to_sequence_parallel_region reduce-scatter          all-gather
=========================================  ======================  ========================
"""
from __future__ import annotations

from typing import Optional

from ..process_group import ProcessGroup, resolve_group
from . import autograd as A
from . import kernels as K
from .functional import _split_size, cached_comm_cell


def _pair(name, group, dim, forward, backward):
    g = resolve_group(group)
    return cached_comm_cell((name, g.ranks, dim), lambda: A.Differentiable(forward(g), backward(g)))


def copy_to_region(x, group: Optional[ProcessGroup] = None):
    return _pair("copy_to_region", group, None, lambda g: A.Identity(),
                 lambda g: K.AllReduceKernel(g, "sum"))(x)


def reduce_from_region(x, group: Optional[ProcessGroup] = None):
    return _pair("reduce_from_region", group, None, lambda g: K.AllReduceKernel(g, "sum"),
                 lambda g: A.Identity())(x)


def scatter_to_region(x, group: Optional[ProcessGroup] = None, dim: int = -1):
    _split_size("scatter_to_region", x, dim, resolve_group(group).size)
    return _pair("scatter_to_region", group, dim, lambda g: K.SplitKernel(g, dim),
                 lambda g: K.AllGatherKernel(g, dim))(x)


def gather_from_region(x, group: Optional[ProcessGroup] = None, dim: int = -1):
    return _pair("gather_from_region", group, dim, lambda g: K.AllGatherKernel(g, dim),
                 lambda g: K.SplitKernel(g, dim))(x)


def scatter_to_sequence_parallel_region(x, group: Optional[ProcessGroup] = None, dim: int = 0):
    _split_size("scatter_to_sequence_parallel_region", x, dim, resolve_group(group).size)
    return _pair("scatter_to_sp", group, dim, lambda g: K.SplitKernel(g, dim),
                 lambda g: K.AllGatherKernel(g, dim))(x)


def gather_from_sequence_parallel_region(x, group: Optional[ProcessGroup] = None, dim: int = 0):
    return _pair("gather_from_sp", group, dim, lambda g: K.AllGatherKernel(g, dim),
                 lambda g: K.ReduceScatterKernel(g, dim))(x)


def reduce_scatter_to_sequence_parallel_region(x, group: Optional[ProcessGroup] = None, dim: int = 0):
    _split_size("reduce_scatter_to_sequence_parallel_region", x, dim, resolve_group(group).size)
    return _pair("reduce_scatter_to_sp", group, dim, lambda g: K.ReduceScatterKernel(g, dim),
                 lambda g: K.AllGatherKernel(g, dim))(x)
