"""matmul / batch matmul (with transpose flags) and linear (``x @ W.T + b``).

Slots: the broadcast batch dims, ``m`` (rows of a), ``n`` (columns of b) and ``k`` (contracted).
``m`` follows a, ``n`` follows b, batch dims follow either. When both sides split ``k`` over the
same axes, each rank multiplies its slices and the output is partial (sum) over those axes. When
only one side splits ``k`` over an axis, the other side must match; the usual cheap fix is to
slice the other side (replicated -> sharded costs nothing) rather than gather the split side.
Candidates (a's shardings first, or b's first; partials kept or reduced) are compared by
redistribution bytes, so a conflicting use of the axis (e.g. b already splits ``n`` over it)
resolves to the cheaper of all-to-all / all-gather.
"""
from __future__ import annotations

from .common import assign, broadcast_shapes, cheapest, common_mesh_layout, expect_inputs, make_layout, partial_options
from .registry import RuleError, RuleResult, register_rule


@register_rule("matmul", "mat_mul", "batch_matmul", "bmm")
def matmul(layouts, shapes, *, transpose_a=False, transpose_b=False):
    expect_inputs(layouts, 2)
    sa, sb = shapes
    if len(sa) < 2 or len(sb) < 2:
        raise RuleError(f"inputs need at least 2 dims, got shapes {sa} and {sb}")
    am, ak = (len(sa) - 1, len(sa) - 2) if transpose_a else (len(sa) - 2, len(sa) - 1)
    bk, bn = (len(sb) - 1, len(sb) - 2) if transpose_b else (len(sb) - 2, len(sb) - 1)
    if sa[ak] != sb[bk]:
        raise RuleError(f"contracting dims differ: input 0 dim {ak} has size {sa[ak]}, input 1 dim {bk} "
                        f"has size {sb[bk]} (transpose_a={transpose_a}, transpose_b={transpose_b})")
    batch = broadcast_shapes([sa[:-2], sb[:-2]])
    nb = len(batch)
    M, N, K = nb, nb + 1, nb + 2

    def slots(shape, special):   # slot per input dim; None for a broadcast batch dim
        off = nb - (len(shape) - 2)
        out = [off + d if shape[d] == batch[off + d] else None for d in range(len(shape) - 2)]
        return out + [special[len(shape) - 2], special[len(shape) - 1]]

    slot_a = slots(sa, {am: M, ak: K})
    slot_b = slots(sb, {bk: K, bn: N})
    mesh = common_mesh_layout(layouts)

    def claims(i):
        layout, sl = layouts[i], (slot_a, slot_b)[i]
        return [] if layout is None else [(s, layout.dims[d]) for d, s in enumerate(sl) if s is not None]

    candidates = []
    for out_partial, in_partials in partial_options("bilinear", layouts):
        for order in ((0, 1), (1, 0)):
            dims = assign(nb + 3, claims(order[0]) + claims(order[1]), reserved=out_partial)
            required = tuple(make_layout(mesh, [dims[s] if s is not None else () for s in sl], p)
                             for sl, p in zip((slot_a, slot_b), in_partials))
            out = make_layout(mesh, dims[:nb] + [dims[M], dims[N]],
                              {**out_partial, **{a: "sum" for a in dims[K]}})
            candidates.append((required, out))
    required, out = cheapest(candidates, layouts, shapes)
    return RuleResult((out,), required)


@register_rule("linear", "dense")
def linear(layouts, shapes, *, transpose_b=True, activation=None):
    """``x @ weight.T + bias`` with weight ``(out, in)`` (``transpose_b=False``: weight ``(in, out)``).
    The bias follows the product's layout; added to a partial-sum product it is fed as a partial
    too (one rank adds it, no communication); a partial average needs nothing (see ``additive``).
    ``activation`` (``nn.Dense(activation=...)``, applied inside the op): the output must not be
    partial, so neither input may split the contracted dim or arrive partial — they are required
    whole along it (an all-gather / all-reduce before the op) instead."""
    expect_inputs(layouts, 2, 3)
    if activation is not None:
        layouts = list(layouts)
        for i, k in ((0, len(shapes[0]) - 1), (1, len(shapes[1]) - (1 if transpose_b else 2))):
            if layouts[i] is not None:
                l = layouts[i]
                layouts[i] = make_layout(l, [() if d == k else l.dims[d] for d in range(len(l.dims))])
    mm = matmul(layouts[:2], shapes[:2], transpose_b=transpose_b)
    if len(layouts) == 2:
        return mm
    out, sbias = mm.output, shapes[2]
    out_shape = broadcast_shapes([shapes[0][:-2], shapes[1][:-2]]) + (
        shapes[0][-2], shapes[1][-2] if transpose_b else shapes[1][-1])
    if len(sbias) > len(out_shape) or broadcast_shapes([out_shape, sbias]) != out_shape:
        raise RuleError(f"bias of shape {sbias} does not broadcast to the product's shape {out_shape}")
    off = len(out_shape) - len(sbias)
    bias = make_layout(out, [out.dims[off + k] if s == out_shape[off + k] else () for k, s in enumerate(sbias)],
                       {a: op for a, op in out.partial.items() if op == "sum"})
    return RuleResult(mm.outputs, mm.inputs + (bias,))
