"""Generation against a static KV cache (``transformer/kv_cache.py``).

``kv_cache_attention``: ``(q (b, n, s, d), k (b, g, s, d), v (b, g, s, dv), cache_slots (s,), mask (b, 1, s, L),
key_cache (b, g, L, d), value_cache (b, g, L, dv)) -> (b, s, n * dv)``: k and v written into the caches at
the slots, then attention over the cache. Batch and heads may stay split (tensor parallel: each rank holds
the cache slice of its key/value heads, split on the same axes as q's heads); the sequence, the head dim and
the cache length are whole; the slots are replicated; the mask keeps the batch split. Partial inputs are
reduced (nonlinear).

``kv_cache_mask``: ``(cache_slots (s,), kv_valid (b, L)) -> (b, 1, s, L)``: the batch split of kv_valid kept.
"""
from __future__ import annotations

from .common import common_mesh_layout, expect_inputs, make_layout
from .registry import RuleError, RuleResult, register_rule


@register_rule("kv_cache_attention")
def kv_cache_attention(layouts, shapes):
    expect_inputs(layouts, 7)
    qs, ks, vs, ss, mk, kc, vc = (tuple(s) for s in shapes)
    if len(qs) != 4 or len(ks) != 4 or len(vs) != 4 or ks[:3] != vs[:3] or qs[0] != ks[0] or qs[2] != ks[2] \
            or qs[3] != ks[3] or qs[1] % ks[1]:
        raise RuleError(f"needs q (b, n, s, d), k (b, g, s, d), v (b, g, s, dv) with g dividing n; got {qs}, {ks}, {vs}")
    if ss != (qs[2],) or kc[:2] != ks[:2] or kc[3] != ks[3] or vc[:2] != vs[:2] or vc[3] != vs[3] or kc[2] != vc[2]:
        raise RuleError(f"needs cache slots (s,) and caches (b, g, L, d) / (b, g, L, dv); got {ss}, {kc}, {vc}")
    if mk not in ((qs[0], 1, qs[2], kc[2]), (1, 1, qs[2], kc[2])):
        raise RuleError(f"the mask must have shape (b, 1, s, L) = {(qs[0], 1, qs[2], kc[2])}; got {mk}")
    mesh = common_mesh_layout(layouts)
    src = next((l for l in layouts[:3] if l is not None), None) or next(l for l in layouts[5:] if l is not None)
    b_axes = tuple(src.dims[0])
    h_axes = tuple(a for a in src.dims[1] if a not in b_axes)
    split = 1
    for a in h_axes:
        split *= mesh.axis_size(a)
    if ks[1] % split:
        raise RuleError(f"{ks[1]} key/value heads are not divisible by the head split {split} (axes {list(h_axes)})")
    heads = make_layout(mesh, (b_axes, h_axes, (), ()))
    mask = make_layout(mesh, (b_axes if mk[0] == qs[0] else (), (), (), ()))
    slots = make_layout(mesh, ((),))
    out = make_layout(mesh, (b_axes, (), h_axes))
    return RuleResult((out,), (heads, heads, heads, slots, mask, heads, heads))


@register_rule("kv_cache_mask")
def kv_cache_mask(layouts, shapes):
    expect_inputs(layouts, 2)
    ss, vs = tuple(shapes[0]), tuple(shapes[1])
    if len(ss) != 1 or len(vs) != 2:
        raise RuleError(f"needs cache slots (s,) and kv_valid (b, L); got {ss}, {vs}")
    mesh = common_mesh_layout(layouts)
    b_axes = tuple(layouts[1].dims[0]) if layouts[1] is not None else ()
    return RuleResult((make_layout(mesh, (b_axes, (), (), ())),),
                      (make_layout(mesh, ((),)), make_layout(mesh, (b_axes, ()))))
