"""Rotary position embedding ``x * cos + rotate(x) * sin``.

``rotate`` mixes positions within the head dim (the last dim of x), so that dim must be whole.
Batch, heads and sequence may stay sharded: cos/sin (full-length tables, broadcastable to x)
are sliced like x, so a rank with positions [s0, s1) gets exactly those rows. The op is linear
in x: a partial-sum x stays partial; cos/sin must not be partial.
"""
from __future__ import annotations

from .common import common_mesh_layout, expect_inputs, make_layout, partials
from .elementwise import broadcast_rule
from .registry import RuleError, RuleResult, register_rule


@register_rule("rotary_embedding", "rotary_position_embedding", "apply_rotary_pos_emb")
def rotary_embedding(layouts, shapes, *, mode=None):
    expect_inputs(layouts, 3)
    return broadcast_rule(layouts, shapes, "first", unsharded=(len(shapes[0]) - 1,))


@register_rule("rotary_embedding_by_position")
def rotary_embedding_by_position(layouts, shapes):
    """``(x (b, s, heads, d), position_ids (b, s), cos, sin (P, 1, d))``: each token rotated by the table
    rows its position picks. x keeps its batch, sequence and head splits (a partial x stays partial);
    the positions are split like x's batch and sequence; the tables stay whole."""
    expect_inputs(layouts, 4)
    xs, ps = shapes[0], shapes[1]
    if len(xs) != 4 or tuple(ps) != tuple(xs[:2]):
        raise RuleError(f"needs x (b, s, heads, d) and position ids (b, s); got shapes {xs}, {ps}")
    mesh = common_mesh_layout(layouts)
    x, pos = layouts[0], layouts[1]
    if x is not None:
        b, s, h = x.dims[0], x.dims[1], x.dims[2]
    elif pos is not None:
        b, s, h = pos.dims[0], pos.dims[1], ()
    else:
        b = s = h = ()
    req_x = make_layout(mesh, (b, s, h, ()), partials(x))
    table = make_layout(mesh, ((), (), ()))
    return RuleResult((req_x,), (req_x, make_layout(mesh, (b, s)), table, table))
