"""Broadcasting elementwise ops, and the engine other families reuse (norms, softmax, rotary,
concat, cross-entropy).

Inputs align from the right (NumPy broadcasting). A dim that an input broadcasts (size 1 against
a larger size) must be unsharded in it. Every other output dim takes the sharding of some input:
the candidates try each decided input first (biggest first); later inputs fill the dims (and
axes) still free, so an input that is replicated where another is sharded is sliced (free)
rather than the other gathered. The candidate with the fewest redistribution bytes wins.
"""
from __future__ import annotations

from typing import Iterable, Optional, Sequence

from ..layout import Layout
from .common import assign, broadcast_shapes, cheapest, common_mesh_layout, make_layout, partial_options, prod
from .registry import RuleResult, Shape, register_rule


def broadcast_rule(layouts: Sequence[Optional[Layout]], shapes: Sequence[Shape], kind: str,
                   unsharded: Iterable[int] = (), reserved: Iterable[str] = (),
                   cost_shapes: Optional[Sequence[Shape]] = None) -> RuleResult:
    """One common layout for broadcasting inputs. ``kind`` says how partials pass (see
    :func:`~.common.resolve_partials`); output dims in ``unsharded`` (counted in the output) are
    never split; mesh axes in ``reserved`` are kept free (the caller uses them). ``cost_shapes``:
    the real input shapes when ``shapes`` were adjusted for alignment (concat)."""
    mesh = common_mesh_layout(layouts)
    out_shape = broadcast_shapes(shapes)
    nd = len(out_shape)
    unsharded = {d % nd for d in unsharded} if nd else set()

    def slots(i):   # output dim of each input dim, None where the input broadcasts
        off = nd - len(shapes[i])
        return [off + k if shapes[i][k] == out_shape[off + k] else None for k in range(len(shapes[i]))]

    decided = sorted((i for i, l in enumerate(layouts) if l is not None), key=lambda i: -prod(shapes[i]))
    candidates = []
    for out_partial, in_partials in partial_options(kind, layouts):
        for first in decided:
            order = [first] + [i for i in decided if i != first]
            claims = [(s, layouts[i].dims[k]) for i in order for k, s in enumerate(slots(i))
                      if s is not None and s not in unsharded]
            dims = assign(nd, claims, reserved=set(out_partial) | set(reserved))
            required = tuple(make_layout(mesh, [dims[s] if s is not None else () for s in slots(i)],
                                         in_partials[i]) for i in range(len(layouts)))
            candidates.append((required, make_layout(mesh, dims, out_partial)))
    required, out = cheapest(candidates, layouts, cost_shapes or shapes)
    return RuleResult((out,), required)


def _rule(kind: str, doc: str):
    def rule(layouts, shapes, **params):   # scalar parameters (alpha, approximate, p...) do not change layouts
        return broadcast_rule(layouts, shapes, kind)
    rule.__doc__ = doc
    rule.__name__ = f"elementwise_{kind}"
    return rule


nonlinear = register_rule(
    "relu", "gelu", "fast_gelu", "silu", "swish", "sigmoid", "tanh", "exp", "log", "sqrt", "rsqrt",
    "reciprocal", "square", "abs", "erf", "softplus", "sin", "cos", "pow", "maximum", "minimum",
    "equal", "not_equal", "less", "less_equal", "greater", "greater_equal", "logical_and",
    "logical_or", "logical_not", "where", "masked_fill", "dropout",
)(_rule("none", "Nonlinear elementwise: partial inputs are reduced first."))
additive = register_rule("add", "sub")(_rule(
    "additive", "add/sub: sum/avg partials stay partial (a non-partial addend of a sum is fed as a partial)."))
bilinear = register_rule("mul")(_rule(
    "bilinear", "mul: partial (sum/avg) times non-partial stays partial; of two partials over one axis, "
    "one is reduced."))
first_linear = register_rule("div", "real_div", "neg")(_rule(
    "first", "div (linear in the numerator), neg: input 0's sum/avg partials are kept, others reduced."))
scale = register_rule("scale")(_rule(
    "first", "tensor times / divided by a Python scalar: linear, partials pass."))
add_scalar = register_rule("add_scalar", "reciprocal_scale")(_rule(
    "none", "tensor plus a Python scalar (or scalar / tensor): not linear, partial inputs are reduced first."))
identity = register_rule("identity", "clone", "contiguous")(_rule("select", "Copies: any partial passes."))


@register_rule("cast")
def cast(layouts, shapes, *, dtype=None):
    """Cast keeps sum/avg partials only to a floating dtype (casting addends to an integer type
    would round each addend); without ``dtype`` partial inputs are reduced."""
    return broadcast_rule(layouts, shapes, "first" if "float" in str(dtype).lower() else "none")
