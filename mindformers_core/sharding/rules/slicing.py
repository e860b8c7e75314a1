"""split / concat / slice. Along an unsharded dim they run locally unchanged; a sharded dim being
split, concatenated or cut must first be made whole (a local split of a shard is not a shard of
the global split). Other dims keep their sharding; partials pass (these ops only pick elements;
concat follows the ``concat`` partial kind)."""
from __future__ import annotations

from .common import common_mesh_layout, expect_inputs, make_layout, norm_axis
from .elementwise import broadcast_rule
from .registry import LocalKernel, RuleError, RuleResult, register_rule


def _whole(x, dims):
    return make_layout(x, [() if d in dims else axes for d, axes in enumerate(x.dims)], x.partial)


@register_rule("split", "chunk")
def split(layouts, shapes, *, axis=0, dim=None, output_num=None, chunks=None, split_size_or_sections=None,
          sizes=None):
    """Pieces: ``output_num``/``chunks`` equal pieces, or ``split_size_or_sections`` (a piece size
    or a list of sizes; ``sizes``: the pieces' sizes as the tracer records them). One output layout per piece."""
    expect_inputs(layouts, 1)
    if sizes is not None:
        split_size_or_sections = list(sizes)
    x, shape = common_mesh_layout(layouts), shapes[0]
    a = norm_axis(axis if dim is None else dim, len(shape))
    size = shape[a]
    n = output_num if output_num is not None else chunks
    if n is not None:
        if n < 1 or size % n:
            raise RuleError(f"dim {a} of size {size} does not split into {n} equal pieces")
        pieces = [size // n] * n
    elif isinstance(split_size_or_sections, int) and split_size_or_sections > 0:
        pieces = [split_size_or_sections] * (size // split_size_or_sections)
        pieces += [size % split_size_or_sections] if size % split_size_or_sections else []
    elif isinstance(split_size_or_sections, (list, tuple)) and sum(split_size_or_sections) == size:
        pieces = list(split_size_or_sections)
    else:
        raise RuleError(f"give output_num/chunks or split_size_or_sections (summing to {size} for dim {a}), "
                        f"got {split_size_or_sections!r}")
    required = _whole(x, {a})
    return RuleResult((required,) * len(pieces), (required,))


@register_rule("concat", "cat")
def concat(layouts, shapes, *, axis=0, dim=None):
    """The concat dim is whole in every input; other dims take a common layout (like elementwise)."""
    if not layouts:
        raise RuleError("expects at least one input")
    nd = len(shapes[0])
    a = norm_axis(axis if dim is None else dim, nd)
    for i, s in enumerate(shapes):
        if len(s) != nd or any(s[d] != shapes[0][d] for d in range(nd) if d != a):
            raise RuleError(f"input {i} of shape {s} does not match input 0 of shape {shapes[0]} "
                            f"outside dim {a}")
    total = sum(s[a] for s in shapes)
    same = [s[:a] + (total,) + s[a + 1:] for s in shapes]   # equal shapes for the common-layout engine
    return broadcast_rule(layouts, same, "concat", unsharded=(a,), cost_shapes=shapes)


def _span(begin, end, step, size):
    b = 0 if begin is None else (begin + size if begin < 0 else begin)
    e = size if end is None else (end + size if end < 0 else end)
    return max(0, min(b, size)), max(0, min(e, size)), 1 if step is None else step


@register_rule("slice", "strided_slice")
def slice_(layouts, shapes, *, begin, end=None, size=None, strides=None):
    """Per dim ``begin`` and ``end`` (``StridedSlice``) or ``size`` (``Slice``; -1 = to the end),
    optional ``strides``. A dim taken whole keeps its sharding; the local op then uses the local
    bounds given in ``result.local.attrs``."""
    expect_inputs(layouts, 1)
    x, shape = common_mesh_layout(layouts), shapes[0]
    nd = len(shape)
    begin = list(begin) + [0] * (nd - len(begin))
    if size is not None:
        end = [shape[d] if s == -1 else b + s for d, (b, s) in enumerate(zip(begin, list(size) + [-1] * nd))]
    end = list(end if end is not None else shape) + list(shape[len(end or shape):])
    strides = list(strides or []) + [1] * (nd - len(strides or []))
    spans = [_span(b, e, s, n) for b, e, s, n in zip(begin, end, strides, shape)]
    if any(s < 1 for _, _, s in spans):
        raise RuleError(f"strides={strides}: only positive strides are supported")
    cut = {d for d, (b, e, s) in enumerate(spans) if (b, e, s) != (0, shape[d], 1)}
    required = _whole(x, cut)
    local = required.local_shape(shape)
    kernel = LocalKernel("strided_slice", {
        "begin": [b if d in cut else 0 for d, (b, _, _) in enumerate(spans)],
        "end": [e if d in cut else local[d] for d, (_, e, _) in enumerate(spans)],
        "strides": [s for _, _, s in spans]})
    return RuleResult((required,), (required,), kernel)


@register_rule("tril", "triu")
def tril(layouts, shapes, *, diagonal=0, k=None):
    """Which elements are kept depends on their (row, column) position, so the last two dims must
    be whole; leading dims keep their sharding. Zeros elsewhere: any partial passes."""
    expect_inputs(layouts, 1)
    x, nd = common_mesh_layout(layouts), len(shapes[0])
    if nd < 2:
        raise RuleError(f"needs at least 2 dims, got shape {shapes[0]}")
    required = _whole(x, {nd - 2, nd - 1})
    return RuleResult((required,), (required,))
