"""Causal scaled dot-product attention ``softmax(q k^T / sqrt(d) + causal) v`` as one op.

Inputs q ``(b, n, s, d)``, k and v ``(b, g, s, d)`` (``g`` key/value heads, each shared by
``n / g`` query heads); output ``(b, s, n * d)`` (heads merged, heads outermost).

* Batch and heads may stay split (heads on the same axes for q and k/v: tensor parallel).
* The head dim ``d`` must be whole.
* The sequence may be split over the context-parallel axis (attr ``seq_axis``, default ``"cp"``)
  only; it must be split the same way in q, k and v. Split, the op runs the context-parallel
  kernel (``LocalKernel("context_parallel_attention")``: ring / Ulysses / hybrid, see
  ``sharding/context_parallel.py``); any other axis on the sequence is gathered first.
* Partial inputs are reduced (nonlinear).
"""
from __future__ import annotations

from .common import common_mesh_layout, expect_inputs, make_layout
from .registry import LocalKernel, RuleError, RuleResult, register_rule


@register_rule("scaled_dot_product_attention", "core_attention")
def scaled_dot_product_attention(layouts, shapes, *, causal=True, seq_axis="cp", algorithm="colossal",
                                 ulysses_degree=None, load_balance=True):
    expect_inputs(layouts, 3)
    qs, ks, vs = shapes
    if len(qs) != 4 or len(ks) != 4 or tuple(ks) != tuple(vs):
        raise RuleError(f"needs q (b, n, s, d) and k, v (b, g, s, d); got shapes {qs}, {ks}, {vs}")
    if qs[0] != ks[0] or qs[2] != ks[2] or qs[3] != ks[3] or qs[1] % ks[1]:
        raise RuleError(f"q {qs} and k/v {ks} disagree on batch, sequence or head dim, or {ks[1]} key/value "
                        f"heads do not divide {qs[1]} query heads")
    if not causal:
        raise RuleError("only causal attention is supported")
    mesh = common_mesh_layout(layouts)
    src = next(l for l in layouts if l is not None)
    b_axes, h_axes, s_axes = src.dims[0], src.dims[1], src.dims[2]
    used = set()
    def free(axes):
        out = []
        for a in axes:
            if a in used:
                break
            out.append(a)
        used.update(out)
        return tuple(out)
    b_axes = free(b_axes)
    s_axes = free(tuple(a for a in s_axes if a == seq_axis))
    h_axes = free(h_axes)
    split = 1
    for a in h_axes:
        split *= mesh.axis_size(a)
    if ks[1] % split:
        raise RuleError(f"{ks[1]} key/value heads are not divisible by the head split {split} (axes {list(h_axes)})")
    req = make_layout(mesh, (b_axes, h_axes, s_axes, ()))
    out = make_layout(mesh, (b_axes, s_axes, h_axes))
    kernel = None
    cp = 1
    for a in s_axes:
        cp *= mesh.axis_size(a)
    if cp > 1:
        kernel = LocalKernel("context_parallel_attention", {
            "seq_axes": s_axes, "algorithm": algorithm, "ulysses_degree": ulysses_degree,
            "load_balance": load_balance, "local_q": req.local_shape(qs), "local_kv": req.local_shape(ks)})
    return RuleResult((out,), (req, req, req), kernel)
