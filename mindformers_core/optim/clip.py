"""Global gradient-norm clipping that counts every element of the global gradient exactly once.

Each rank holds *pieces* of the global gradient: a tensor-parallel shard, a pipeline stage's
parameters, an hsdp shard, or a copy of a replicated tensor. The global squared norm is

    sum over pieces of  weight_i * ||g_i||^2,   all-reduced (sum) over ``groups``

where ``groups`` are the orthogonal groups the pieces are spread over (e.g. the tensor-parallel,
pipeline and hsdp shard groups) and ``weight_i = 1 / (number of ranks in those groups holding
the same copy of piece i)``: 1 for a piece split over every group, ``1/tp`` for a LayerNorm
weight replicated over the tensor-parallel group, ... ``replication_weights`` derives the
weights from parameters' layouts (``sharding.annotations.layout_of``). Groups must be orthogonal
(their product holds each rank once): the all-reduces run one after the other.

``ClipGradNorm`` is a Cell for use inside ``ms.jit`` (build it outside, call it inside);
``clip_grad_norm`` is the PyNative convenience function.
"""
from __future__ import annotations

import math
from typing import Dict, Mapping, Optional, Sequence, Tuple

import mindspore as ms
from mindspore import nn, ops

from ..distributed.comm import kernels as K
from ..distributed.process_group import ProcessGroup, resolve_group


def _groups(groups) -> Tuple[ProcessGroup, ...]:
    return tuple(resolve_group(g) for g in (groups or ()) if g is not None)


class GlobalNorm(nn.Cell):
    """``construct(grads) -> total norm`` (float32 scalar), see the module docstring."""

    def __init__(self, groups: Sequence = (), weights: Optional[Sequence[float]] = None):
        super().__init__(auto_prefix=False)
        self.weights = None if weights is None else tuple(float(w) for w in weights)
        self.reducers = nn.CellList([K.AllReduceKernel(g, "sum") for g in _groups(groups) if g.size > 1])
        self.n_reducers = len(self.reducers)

    def construct(self, grads):
        total = ops.zeros((1,), ms.float32)
        for i in range(len(grads)):     # no cast of a float32 gradient, no product by a weight of 1
            g = grads[i] if grads[i].dtype == ms.float32 else ops.cast(grads[i], ms.float32)
            sq = ops.square(g).sum()
            if self.weights is not None and self.weights[i] != 1.0:
                sq = sq * self.weights[i]
            total = total + sq
        for j in range(self.n_reducers):
            total = self.reducers[j](total)
        return ops.sqrt(total.reshape(()))


class ClipGradNorm(nn.Cell):
    """``construct(grads) -> (clipped grads, total norm)``: scales every gradient by
    ``min(1, max_norm / (norm + eps))`` (``torch.nn.utils.clip_grad_norm_``)."""

    def __init__(self, max_norm: float, groups: Sequence = (), weights: Optional[Sequence[float]] = None,
                 eps: float = 1e-6):
        super().__init__(auto_prefix=False)
        if isinstance(max_norm, bool) or not isinstance(max_norm, (int, float)) or max_norm <= 0:
            raise ValueError(f"clip_grad_norm: max_norm={max_norm!r} must be a number > 0")
        self.max_norm, self.eps = float(max_norm), float(eps)
        self.norm = GlobalNorm(groups, weights)

    def construct(self, grads):
        total = self.norm(grads)
        if self.max_norm == math.inf:   # no clipping: the norm is a side output, the update does not wait for it
            return grads, total
        coef = ops.minimum(self.max_norm / (total + self.eps), ops.ones_like(total))
        out = ()
        for i in range(len(grads)):     # coef is float32: cast only for other gradient dtypes
            out = out + (grads[i] * (coef if grads[i].dtype == ms.float32 else ops.cast(coef, grads[i].dtype)),)
        return out, total


_CACHE: Dict[tuple, ClipGradNorm] = {}


def clip_grad_norm(grads, max_norm: float, groups: Sequence = (), weights: Optional[Sequence[float]] = None,
                   eps: float = 1e-6):
    """PyNative: ``(clipped grads, total norm)``; inside ``ms.jit`` use a ``ClipGradNorm`` Cell."""
    gs = _groups(groups)
    key = (float(max_norm), tuple(g.ranks for g in gs), None if weights is None else tuple(weights),
           float(eps), len(grads))
    cell = _CACHE.get(key)
    if cell is None:
        cell = _CACHE[key] = ClipGradNorm(max_norm, gs, weights, eps)
    return cell(tuple(grads))


def global_norm(grads, groups: Sequence = (), weights: Optional[Sequence[float]] = None):
    """PyNative: the global gradient norm (see the module docstring)."""
    return GlobalNorm(groups, weights)(tuple(grads))


def replication_weights(params, axis_groups: Mapping[str, object]) -> Tuple[float, ...]:
    """Per-parameter weights for ``clip_grad_norm`` from each parameter's layout (``layout_of``).

    ``axis_groups`` maps a mesh axis name (``"tp"``, ``"cp"``...) to its group (or its size): a
    parameter not split over that axis is replicated there and gets a factor ``1 / size``.
    Parameters without a layout (not sharded by ``parallelize``) count as replicated over every axis given. Axes whose
    ranks hold different parameters (pipeline stages) belong in ``groups`` only, not here.
    """
    from ..sharding.annotations import layout_of
    from ..sharding.layout import as_layout

    sizes = {}
    for axis, g in axis_groups.items():
        sizes[axis] = g if isinstance(g, int) else resolve_group(g).size
    out = []
    for p in params:
        layout = layout_of(p)
        split = set(as_layout(layout).sharded_axes()) if layout is not None else set()
        w = 1.0
        for axis, size in sizes.items():
            if axis not in split:
                w /= size
        out.append(w)
    return tuple(out)
