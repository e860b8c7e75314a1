"""Ops that normalize along dims: softmax / log-softmax along an axis, RMSNorm and LayerNorm over
the trailing dims. The normalized dims must be whole on every rank (the rule requires them
unsharded: an all-gather if they were split) and partial inputs are reduced first; every other
dim keeps its sharding (e.g. sequence-parallel norms). Norm weights (and bias) follow: they span
only normalized dims, so they are replicated.
"""
from __future__ import annotations

from .common import expect_inputs, norm_axes
from .elementwise import broadcast_rule
from .registry import RuleError, register_rule


@register_rule("softmax", "log_softmax")
def softmax(layouts, shapes, *, axis=-1, dim=None):
    expect_inputs(layouts, 1)
    axes = norm_axes(axis if dim is None else dim, len(shapes[0]))
    return broadcast_rule(layouts, shapes, "none", unsharded=axes)


def _norm(layouts, shapes, begin_norm_axis):
    x, params = shapes[0], shapes[1:]
    if begin_norm_axis is None:
        begin_norm_axis = len(x) - max((len(p) for p in params), default=1)
    begin = norm_axes(begin_norm_axis, len(x), "begin_norm_axis")[0]
    for i, p in enumerate(params, 1):
        if len(p) > len(x) - begin or any(s not in (1, x[len(x) - len(p) + k]) for k, s in enumerate(p)):
            raise RuleError(f"input {i} of shape {p} does not match the normalized dims "
                            f"{list(range(begin, len(x)))} of the input shape {x}")
    return broadcast_rule(layouts, shapes, "none", unsharded=range(begin, len(x)))


@register_rule("rms_norm")
def rms_norm(layouts, shapes, *, epsilon=None, eps=None, begin_norm_axis=None):
    """``rms_norm(x, weight)``; the weight spans the trailing normalized dims. One output: y."""
    expect_inputs(layouts, 1, 2)
    return _norm(layouts, shapes, begin_norm_axis)


@register_rule("layer_norm")
def layer_norm(layouts, shapes, *, epsilon=None, eps=None, begin_norm_axis=None, begin_params_axis=None):
    """``layer_norm(x, weight[, bias])``. One output: y (not the saved mean / rstd)."""
    expect_inputs(layouts, 1, 2, 3)
    return _norm(layouts, shapes, begin_norm_axis)
