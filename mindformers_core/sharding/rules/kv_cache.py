"""Generation against a static KV cache (``transformer/kv_cache.py``).

``kv_cache_attention``: ``(q (b, n, s, d), k (b, g, s, d), v (b, g, s, dv), mask (b, 1, s, L), scatter (L, s),
written (1, 1, L, 1), cos (b, 1, s, d), sin (b, 1, s, d), key_cache (b, g, L, d), value_cache (b, g, L, dv)) ->
(b, s, n * dv)``: q and k rotated, k and v written into the caches at the slots, then attention over the cache.
Batch and heads may stay split (tensor parallel: each rank holds the cache slice of its key/value heads, split
on the same axes as q's heads); the sequence, the head dim and the cache length are whole; the scatter and
the written slots are replicated; the mask and the rotary rows keep the batch split. Partial inputs are
reduced (nonlinear).

``kv_cache_step``: ``(position_ids (b, s), cache_slots (s,), kv_valid (b, L), cos, sin tables (P, 1, d)) ->
(mask (b, 1, s, L), scatter (L, s), written (1, 1, L, 1), cos (b, 1, s, d), sin (b, 1, s, d))``: the batch split
of the positions (or kv_valid) kept; the slots, the scatter and the tables replicated.

``latent_kv_cache``: ``(q_rot (b, n, s, dr), latent (b, 1, s, r), k_rot (b, 1, s, dr), scatter (L, s),
written (1, 1, L, 1), cos, sin (b, 1, s, dr), latent_cache (b, 1, L, r), rope_cache (b, 1, L, dr)) -> (q_rot,
latents (b, 1, L, r), rotated keys (b, 1, L, dr))``: multi-latent attention's compressed cache. q's heads may stay
split; the latent and the shared rotary key are whole on every rank (every head needs them); the batch split
is kept everywhere.
"""
from __future__ import annotations

from .common import common_mesh_layout, expect_inputs, make_layout
from .registry import RuleError, RuleResult, register_rule


@register_rule("kv_cache_attention")
def kv_cache_attention(layouts, shapes):
    expect_inputs(layouts, 10)
    qs, ks, vs, mk, sc, wr, cs, sn, kc, vc = (tuple(s) for s in shapes)
    if len(qs) != 4 or len(ks) != 4 or len(vs) != 4 or ks[:3] != vs[:3] or qs[0] != ks[0] or qs[2] != ks[2] \
            or qs[3] != ks[3] or qs[1] % ks[1]:
        raise RuleError(f"needs q (b, n, s, d), k (b, g, s, d), v (b, g, s, dv) with g dividing n; got {qs}, {ks}, {vs}")
    length = kc[2] if len(kc) == 4 else None
    if len(kc) != 4 or kc[:2] != ks[:2] or kc[3] != ks[3] or vc[:2] != vs[:2] or vc[3] != vs[3] or kc[2] != vc[2]:
        raise RuleError(f"needs caches (b, g, L, d) / (b, g, L, dv); got {kc}, {vc}")
    if sc != (length, qs[2]) or wr != (1, 1, length, 1):
        raise RuleError(f"needs scatter (L, s) = {(length, qs[2])} and written (1, 1, L, 1); got {sc}, {wr}")
    if mk not in ((qs[0], 1, qs[2], length), (1, 1, qs[2], length)):
        raise RuleError(f"the mask must have shape (b, 1, s, L) = {(qs[0], 1, qs[2], length)}; got {mk}")
    if cs != sn or cs != (qs[0], 1, qs[2], qs[3]):
        raise RuleError(f"the rotary rows must have shape (b, 1, s, d) = {(qs[0], 1, qs[2], qs[3])}; got {cs}, {sn}")
    mesh = common_mesh_layout(layouts)
    src = next((l for l in layouts[:3] if l is not None), None) or next(l for l in layouts[8:] if l is not None)
    b_axes = tuple(src.dims[0])
    h_axes = tuple(a for a in src.dims[1] if a not in b_axes)
    split = 1
    for a in h_axes:
        split *= mesh.axis_size(a)
    if ks[1] % split:
        raise RuleError(f"{ks[1]} key/value heads are not divisible by the head split {split} (axes {list(h_axes)})")
    heads = make_layout(mesh, (b_axes, h_axes, (), ()))
    mask = make_layout(mesh, (b_axes if mk[0] == qs[0] else (), (), (), ()))
    rows = make_layout(mesh, (b_axes, (), (), ()))
    scatter = make_layout(mesh, ((), ()))
    written = make_layout(mesh, ((), (), (), ()))
    out = make_layout(mesh, (b_axes, (), h_axes))
    return RuleResult((out,), (heads, heads, heads, mask, scatter, written, rows, rows, heads, heads))


@register_rule("kv_cache_step")
def kv_cache_step(layouts, shapes):
    expect_inputs(layouts, 5)
    ps, ss, vs = tuple(shapes[0]), tuple(shapes[1]), tuple(shapes[2])
    if len(ps) != 2 or len(ss) != 1 or len(vs) != 2 or ps[1] != ss[0] or ps[0] != vs[0]:
        raise RuleError(f"needs position ids (b, s), cache slots (s,) and kv_valid (b, L); got {ps}, {ss}, {vs}")
    mesh = common_mesh_layout(layouts)
    given = layouts[0] if layouts[0] is not None else layouts[2]
    b_axes = tuple(given.dims[0]) if given is not None else ()
    table = make_layout(mesh, ((), (), ()))
    batch4 = make_layout(mesh, (b_axes, (), (), ()))
    outputs = (batch4, make_layout(mesh, ((), ())), make_layout(mesh, ((), (), (), ())), batch4, batch4)
    return RuleResult(outputs, (make_layout(mesh, (b_axes, ())), make_layout(mesh, ((),)),
                                make_layout(mesh, (b_axes, ())), table, table))


@register_rule("latent_kv_cache")
def latent_kv_cache(layouts, shapes):
    expect_inputs(layouts, 9)
    qs, ls, ks, sc, wr, cs, sn, lc, rc = (tuple(s) for s in shapes)
    length = lc[2] if len(lc) == 4 else None
    if len(qs) != 4 or ls[:3] != (qs[0], 1, qs[2]) or ks != (qs[0], 1, qs[2], qs[3]):
        raise RuleError(f"needs q_rot (b, n, s, dr), latent (b, 1, s, r), k_rot (b, 1, s, dr); got {qs}, {ls}, {ks}")
    if len(lc) != 4 or lc[:2] != (qs[0], 1) or lc[3] != ls[3] or rc != (qs[0], 1, length, qs[3]):
        raise RuleError(f"needs caches (b, 1, L, r) / (b, 1, L, dr); got {lc}, {rc}")
    if sc != (length, qs[2]) or wr != (1, 1, length, 1):
        raise RuleError(f"needs scatter (L, s) = {(length, qs[2])} and written (1, 1, L, 1); got {sc}, {wr}")
    if cs != sn or cs != (qs[0], 1, qs[2], qs[3]):
        raise RuleError(f"the rotary rows must have shape (b, 1, s, dr) = {(qs[0], 1, qs[2], qs[3])}; got {cs}, {sn}")
    mesh = common_mesh_layout(layouts)
    src = next(l for l in layouts if l is not None)
    b_axes = tuple(src.dims[0])
    q_layout = layouts[0]
    h_axes = tuple(a for a in q_layout.dims[1] if a not in b_axes) if q_layout is not None else ()
    heads = make_layout(mesh, (b_axes, h_axes, (), ()))
    whole = make_layout(mesh, (b_axes, (), (), ()))
    scatter = make_layout(mesh, ((), ()))
    written = make_layout(mesh, ((), (), (), ()))
    return RuleResult((heads, whole, whole), (heads, whole, whole, scatter, written, whole, whole, whole, whole))
