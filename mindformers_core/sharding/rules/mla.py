"""Multi-latent attention's shared rotary key: ``(k_nope (b, s, n, dn), k_rot (b, s, 1, dr)) -> (b, s, n,
dn + dr)``, k_rot appended to every head's key.

The heads of k_nope may stay split (tensor parallel), its batch and sequence too; k_rot must be split like
k_nope's batch and sequence and whole over its single head, and each rank expands it to the heads it holds
(the op run unchanged on local shards). Both last dims must be whole. A partial input is reduced first.
"""
from __future__ import annotations

from .common import common_mesh_layout, expect_inputs, make_layout
from .registry import RuleError, RuleResult, register_rule


@register_rule("shared_rotary_key")
def shared_rotary_key(layouts, shapes):
    expect_inputs(layouts, 2)
    ks, rs = shapes
    if len(ks) != 4 or len(rs) != 4 or tuple(rs[:2]) != tuple(ks[:2]) or rs[2] != 1:
        raise RuleError(f"needs k_nope (b, s, n, dn) and k_rot (b, s, 1, dr); got shapes {ks}, {rs}")
    mesh = common_mesh_layout(layouts)
    src = layouts[0] if layouts[0] is not None else layouts[1]
    b, s = src.dims[0], src.dims[1]
    used = set(b) | set(s)
    h = tuple(a for a in (layouts[0].dims[2] if layouts[0] is not None else ()) if a not in used)
    out = make_layout(mesh, (b, s, h, ()))
    return RuleResult((out,), (out, make_layout(mesh, (b, s, (), ()))))
