"""Ops that move elements without computing: reshape/view (and flatten, expand_dims, squeeze),
transpose/permute, broadcast_to, repeat_interleave. Any partial input passes through.

Reshape groups input and output dims into the smallest runs with equal products (``(B, S, H*D)
-> (B, S, H, D)`` gives ``B|B, S|S, H*D|H,D``). In each group only the outermost non-trivial
input dim may stay sharded: a shard of it is one contiguous run of the flattened group, so
merging it with the following dims keeps it, and splitting it keeps the shard on the outermost
new dim when that dim's size is divisible by the split (otherwise the longest prefix of its axes
that divides; the remaining axes are gathered). Sharded inner dims of a group are gathered.
"""
from __future__ import annotations

from typing import List, Sequence, Tuple

from .common import common_mesh_layout, expect_inputs, make_layout, norm_axes, norm_axis, prod
from .registry import LocalKernel, RuleError, RuleResult, Shape, register_rule, register_shape_from_input


def _target(src: Shape, shape: Sequence[int]) -> Shape:
    shape = [int(s) for s in shape]
    if shape.count(-1) > 1:
        raise RuleError(f"target shape {tuple(shape)} has more than one -1")
    if -1 in shape:
        rest = prod(s for s in shape if s != -1)
        if rest == 0 or prod(src) % rest:
            raise RuleError(f"cannot reshape {src} to {tuple(shape)}")
        shape[shape.index(-1)] = prod(src) // rest
    if prod(shape) != prod(src) or any(s < 0 for s in shape):
        raise RuleError(f"cannot reshape {src} ({prod(src)} elements) to {tuple(shape)} "
                        f"({prod(shape)} elements)")
    return tuple(shape)


def _groups(src: Shape, dst: Shape) -> List[Tuple[List[int], List[int]]]:
    groups, i, j = [], 0, 0
    while i < len(src) or j < len(dst):
        gi, go, pi, pj = [], [], 1, 1
        if i < len(src):
            gi.append(i); pi *= src[i]; i += 1
        if j < len(dst):
            go.append(j); pj *= dst[j]; j += 1
        while pi != pj:
            if pi < pj:
                gi.append(i); pi *= src[i]; i += 1
            else:
                go.append(j); pj *= dst[j]; j += 1
        groups.append((gi, go))
    return groups


def reshape_layouts(x, src: Shape, dst: Shape):
    """``(required input layout, output layout)`` for reshaping ``src`` to ``dst``."""
    req: List[tuple] = [()] * len(src)
    out: List[tuple] = [()] * len(dst)
    for gi, go in _groups(src, dst):
        lead = next((d for d in gi if src[d] > 1), None)
        lead_out = next((d for d in go if dst[d] > 1), None)
        if lead is None or lead_out is None:
            continue
        keep, n = [], 1
        for a in x.dims[lead]:
            n *= x.axis_size(a)
            if dst[lead_out] % n:
                break
            keep.append(a)
        req[lead] = out[lead_out] = tuple(keep)
    return make_layout(x, req, x.partial), make_layout(x, out, x.partial)


def _reshape(layouts, shapes, dst, local=True):
    expect_inputs(layouts, 1)
    x = common_mesh_layout(layouts)
    dst = _target(shapes[0], dst)
    required, out = reshape_layouts(x, shapes[0], dst)
    kernel = LocalKernel("reshape", {"shape": out.local_shape(dst)}) if local else None
    return RuleResult((out,), (required,), kernel)


@register_rule("reshape", "view")
def reshape(layouts, shapes, *, shape):
    """The local op reshapes to the local target shape (``result.local.attrs['shape']``)."""
    return _reshape(layouts, shapes, shape)


@register_rule("flatten")
def flatten(layouts, shapes, *, start_dim=1, end_dim=-1):
    """Default ``start_dim=1`` as ``ops.Flatten`` (``mint.flatten`` uses 0: pass it)."""
    src = shapes[0]
    if not src:
        return _reshape(layouts, shapes, (1,), local=False)
    s, e = norm_axis(start_dim, len(src), "start_dim"), norm_axis(end_dim, len(src), "end_dim")
    return _reshape(layouts, shapes, src[:s] + (prod(src[s:e + 1]),) + src[e + 1:], local=False)


@register_rule("expand_dims", "unsqueeze")
def expand_dims(layouts, shapes, *, axis=None, dim=None):
    src = shapes[0]
    a = norm_axis(dim if axis is None else axis, len(src) + 1)
    return _reshape(layouts, shapes, src[:a] + (1,) + src[a:], local=False)


@register_rule("squeeze")
def squeeze(layouts, shapes, *, axis=None, dim=None):
    src = shapes[0]
    axes = norm_axes(dim if axis is None else axis, len(src))
    if axis is None and dim is None:
        axes = tuple(d for d in axes if src[d] == 1)
    if any(src[d] != 1 for d in axes):
        raise RuleError(f"squeeze: dims {[d for d in axes if src[d] != 1]} of shape {src} are not of size 1")
    return _reshape(layouts, shapes, tuple(s for d, s in enumerate(src) if d not in axes), local=False)


@register_rule("transpose", "permute")
def transpose(layouts, shapes, *, perm=None, dims=None, dim0=None, dim1=None):
    """``perm``/``dims`` (a permutation), or ``dim0``/``dim1`` (swap two dims)."""
    expect_inputs(layouts, 1)
    x, nd = common_mesh_layout(layouts), len(shapes[0])
    perm = perm if perm is not None else dims
    if perm is None:
        if dim0 is None or dim1 is None:
            raise RuleError("give perm (or dims), or dim0 and dim1")
        perm = list(range(nd))
        a, b = norm_axis(dim0, nd, "dim0"), norm_axis(dim1, nd, "dim1")
        perm[a], perm[b] = perm[b], perm[a]
    perm = [norm_axis(p, nd, "perm") for p in perm]
    if sorted(perm) != list(range(nd)):
        raise RuleError(f"perm={tuple(perm)} is not a permutation of {nd} dims")
    return RuleResult((make_layout(x, [x.dims[p] for p in perm], x.partial),), (x,))


@register_rule("broadcast_to", "expand")
def broadcast_to(layouts, shapes, *, shape):
    """New and size-1 (broadcast) dims are unsharded; the local op broadcasts to the local shape."""
    expect_inputs(layouts, 1)
    x, src = common_mesh_layout(layouts), shapes[0]
    dst = [int(s) for s in shape]
    off = len(dst) - len(src)
    if off < 0:
        raise RuleError(f"cannot broadcast shape {src} to {tuple(dst)}")
    dst = tuple(src[d - off] if s == -1 and d >= off else s for d, s in enumerate(dst))
    if any(s < 0 for s in dst) or any(s not in (1, dst[off + k]) for k, s in enumerate(src)):
        raise RuleError(f"cannot broadcast shape {src} to {dst}")
    req = [x.dims[k] if s == dst[off + k] else () for k, s in enumerate(src)]
    required = make_layout(x, req, x.partial)
    out = make_layout(x, [()] * off + req, x.partial)
    return RuleResult((out,), (required,), LocalKernel("broadcast_to", {"shape": out.local_shape(dst)}))


@register_rule("repeat_interleave")
def repeat_interleave(layouts, shapes, *, repeats, axis=None, dim=None):
    """An int ``repeats`` along a dim keeps its sharding (chunk i of the output is the repeat of
    chunk i of the input); per-element repeats or a flattening call (no axis) need it whole."""
    expect_inputs(layouts, 1)
    x = common_mesh_layout(layouts)
    a = dim if axis is None else axis
    if a is None:
        required = make_layout(x, [()] * len(shapes[0]), x.partial)
        return RuleResult((make_layout(x, [()], x.partial),), (required,))
    a = norm_axis(a, len(shapes[0]))
    if isinstance(repeats, int):
        return RuleResult((x,), (x,))
    required = make_layout(x, [() if d == a else axes for d, axes in enumerate(x.dims)], x.partial)
    return RuleResult((required,), (required,))


# the local kernels of reshape and broadcast_to are the same op with the local target shape: correct when
# the model computes the target shape from its input's shape (``x.reshape(b, s, -1, head_dim)`` with
# ``b, s = x.shape``), the documented contract
register_shape_from_input("reshape", "broadcast_to")
