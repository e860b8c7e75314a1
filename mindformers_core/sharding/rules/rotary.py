"""Rotary position embedding ``x * cos + rotate(x) * sin``.

``rotate`` mixes positions within the head dim (the last dim of x), so that dim must be whole.
Batch, heads and sequence may stay sharded: cos/sin (full-length tables, broadcastable to x)
are sliced like x, so a rank with positions [s0, s1) gets exactly those rows. The op is linear
in x: a partial-sum x stays partial; cos/sin must not be partial.
"""
from __future__ import annotations

from .common import expect_inputs
from .elementwise import broadcast_rule
from .registry import register_rule


@register_rule("rotary_embedding", "rotary_position_embedding", "apply_rotary_pos_emb")
def rotary_embedding(layouts, shapes, *, mode=None):
    expect_inputs(layouts, 3)
    return broadcast_rule(layouts, shapes, "first", unsharded=(len(shapes[0]) - 1,))
