"""Reductions over axes (sum, mean, max, min; argmax/argmin), with ``keep_dims``.

Reducing a sharded dim leaves each rank with the reduction of its own slice, so the output is
partial over that dim's axes: ``sum`` -> Partial("sum"), ``max``/``min`` -> Partial("max"/"min"),
``mean`` -> Partial("avg"). For the mean: shards are equal-sized, so the global mean is the
average of the local means and the local op needs no rescaling (the same value as Partial("sum")
of ``local_mean / split``). Input partials pass when they commute with the reduction (sum/avg
through sum and mean, max through max, min through min); others are reduced first. argmax/argmin
need the reduced dims whole.
"""
from __future__ import annotations

from .common import LINEAR, common_mesh_layout, expect_inputs, make_layout, norm_axes
from .registry import RuleResult, register_rule

_PARTIAL = {"sum": "sum", "mean": "avg", "max": "max", "min": "min"}
_PASSES = {"sum": LINEAR, "mean": LINEAR, "max": ("max",), "min": ("min",)}


def _reduce(kind, x, axes, keep):
    kept = {a: op for a, op in x.partial.items() if op in _PASSES.get(kind, ())}
    whole = () if kind in _PARTIAL else axes   # argmax/argmin: the reduced dims must be whole
    dims = [() if d in whole else split for d, split in enumerate(x.dims)]
    out_partial = dict(kept)
    for d in axes:
        out_partial.update({a: _PARTIAL[kind] for a in dims[d]})
    out_dims = [() if d in axes else split for d, split in enumerate(dims) if keep or d not in axes]
    return RuleResult((make_layout(x, out_dims, out_partial),), (make_layout(x, dims, kept),))


def _make(kind):
    def rule(layouts, shapes, *, axis=None, dim=None, keep_dims=False, keepdim=False):
        """``axis``/``dim``: an int, a tuple, or None (all dims); ``keep_dims``/``keepdim``."""
        expect_inputs(layouts, 1)
        axes = norm_axes(dim if axis is None else axis, len(shapes[0]))
        return _reduce(kind, common_mesh_layout(layouts), axes, keep_dims or keepdim)
    rule.__name__ = f"reduce_{kind}"
    return rule


reduce_sum = register_rule("sum", "reduce_sum")(_make("sum"))
reduce_mean = register_rule("mean", "reduce_mean")(_make("mean"))
reduce_max = register_rule("max", "amax", "reduce_max")(_make("max"))   # values only (see docs)
reduce_min = register_rule("min", "amin", "reduce_min")(_make("min"))
argmax = register_rule("argmax")(_make("argmax"))
argmin = register_rule("argmin")(_make("argmin"))
