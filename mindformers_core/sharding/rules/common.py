"""Helpers shared by the rule families: building layouts from per-dim axes, deciding which
partial (pending-reduction) axes survive an op, greedy axis assignment, and picking the
cheapest candidate by redistribution bytes."""
from __future__ import annotations

from functools import lru_cache
from typing import Dict, Iterable, List, Optional, Sequence, Set, Tuple

from ..layout import Layout
from ..redistribution import plan_redistribution
from .registry import RuleError, Shape

Axes = Tuple[str, ...]
Partials = Dict[str, str]

LINEAR = ("sum", "avg")   # partial ops that commute with linear maps (max/min do not)


def common_mesh_layout(layouts: Sequence[Optional[Layout]]) -> Layout:
    """The layout whose device matrix (mesh) a rule builds its outputs on: the first input that has one."""
    for l in layouts:
        if l is not None:
            return l
    raise RuleError("no input has a layout yet; give at least one input layout")


def make_layout(mesh: Layout, dims: Sequence[Axes], partial: Optional[Partials] = None) -> Layout:
    """A tensor layout on ``mesh``'s device matrix from per-dim axes and ``{axis: op}`` partials."""
    out = mesh(*[(axes if len(axes) > 1 else axes[0]) if axes else "None" for axes in dims]).without_partial()
    for op in sorted(set((partial or {}).values())):
        out = out.with_partial([a for a, o in partial.items() if o == op], op)
    return out


def expect_inputs(layouts: Sequence, *counts: int) -> None:
    if len(layouts) not in counts:
        want = " or ".join(str(c) for c in counts)
        raise RuleError(f"expects {want} inputs, got {len(layouts)}")


def norm_axis(axis: int, ndim: int, what: str = "axis") -> int:
    if not isinstance(axis, int) or not -ndim <= axis < max(ndim, 1):
        raise RuleError(f"{what}={axis!r} is out of range for a {ndim}-dim input")
    return axis % ndim if ndim else 0


def norm_axes(axis, ndim: int, what: str = "axis") -> Tuple[int, ...]:
    """``None`` = all dims; an int or a sequence of ints."""
    if axis is None or (isinstance(axis, (tuple, list)) and len(axis) == 0):
        return tuple(range(ndim))
    items = axis if isinstance(axis, (tuple, list)) else (axis,)
    return tuple(sorted({norm_axis(a, ndim, what) for a in items}))


def broadcast_shapes(shapes: Sequence[Shape]) -> Shape:
    nd = max((len(s) for s in shapes), default=0)
    out = []
    for d in range(nd):
        sizes = {s[d - nd + len(s)] for s in shapes if d - nd + len(s) >= 0} - {1}
        if len(sizes) > 1:
            raise RuleError(f"shapes {[tuple(s) for s in shapes]} do not broadcast (dim {d} from the "
                            f"left of the result has sizes {sorted(sizes)})")
        out.append(sizes.pop() if sizes else 1)
    return tuple(out)


def partials(layout: Optional[Layout]) -> Partials:
    return {} if layout is None else dict(layout.partial)


def resolve_partials(kind: str, layouts: Sequence[Optional[Layout]]) -> Tuple[Partials, List[Partials]]:
    """Which pending reductions an op can carry through: ``(output partials, required partials
    per input)``. Kinds:

    * ``none``: nonlinear (relu, softmax, ...): every partial input is reduced first.
    * ``select``: single input, moves or picks elements (reshape, transpose, slice): any partial
      op passes through.
    * ``first``: linear in input 0 only (div's numerator, neg, rotary): input 0's sum/avg kept.
    * ``bilinear``: linear in each input separately (mul, matmul): a sum/avg axis is kept on the
      first input that has it; a second input partial over the same axis is reduced.
    * ``additive`` / ``concat``: jointly linear (add, sub; concat only picks elements). An axis
      partial ``sum`` on some inputs stays partial and the other inputs are fed as partials too
      (zero on all but one rank: free). An axis partial ``avg`` (concat: also max/min) stays
      partial and the other inputs stay as they are: a value replicated over the axis already
      averages (maxes) to itself. Mixed ops on one axis are reduced.
    """
    parts = [partials(l) for l in layouts]
    n = len(layouts)
    if kind == "none":
        return {}, [{} for _ in range(n)]
    if kind == "select":
        return dict(parts[0]), [dict(parts[0])] + [{} for _ in range(n - 1)]
    if kind == "first":
        keep = {a: op for a, op in parts[0].items() if op in LINEAR}
        return keep, [keep] + [{} for _ in range(n - 1)]
    if kind == "bilinear":
        out: Partials = {}
        req = []
        for p in parts:
            mine = {a: op for a, op in p.items() if op in LINEAR and a not in out}
            out.update(mine)
            req.append(mine)
        return out, req
    if kind in ("additive", "concat"):
        out, req = {}, [{} for _ in range(n)]
        idempotent = ("avg",) if kind == "additive" else ("avg", "max", "min")
        for a in sorted({a for p in parts for a in p}):
            ops = {p[a] for p in parts if a in p}
            op = ops.pop() if len(ops) == 1 else None
            if op == "sum" or op in idempotent:
                out[a] = op
                for p, r in zip(parts, req):
                    if op == "sum" or a in p:
                        r[a] = op
        return out, req
    raise ValueError(f"unknown partial kind {kind!r}")


def partial_options(kind: str, layouts: Sequence[Optional[Layout]]):
    """Keep what ``kind`` allows, or reduce everything (e.g. reduce-scatter a partial into a shard
    may be cheaper than gathering the other input)."""
    keep = resolve_partials(kind, layouts)
    drop = ({}, [{} for _ in layouts])
    return [keep] if keep == drop else [keep, drop]


def assign(n_slots: int, claims: Iterable[Tuple[int, Axes]], reserved: Iterable[str] = ()) -> List[Axes]:
    """Greedy: each slot (output/contracting dim) takes the first claim in priority order whose
    leading axes are still free (the longest free prefix: outer splits can be kept while inner ones
    are gathered). Sharding is preferred over replication since slicing costs nothing."""
    dims: List[Axes] = [()] * n_slots
    used: Set[str] = set(reserved)
    for slot, axes in claims:
        if dims[slot]:
            continue
        keep = []
        for a in axes:
            if a in used:
                break
            keep.append(a)
        if keep:
            dims[slot] = tuple(keep)
            used.update(keep)
    return dims


@lru_cache(maxsize=4096)
def _bytes(src: Layout, dst: Layout, shape: Shape) -> float:
    try:
        return plan_redistribution(src, dst, shape).bytes_per_rank
    except ValueError:
        return float("inf")


def redistribution_bytes(given: Optional[Layout], required: Layout, shape: Shape) -> float:
    """Per-rank bytes to move an input from ``given`` to ``required`` (undecided inputs: free)."""
    if given is None or given == required:
        return 0
    return _bytes(given, required, tuple(shape))


def cheapest(candidates, given: Sequence[Optional[Layout]], shapes: Sequence[Shape]):
    """The candidate ``(required_inputs, output, *rest)`` whose input redistributions move the
    fewest bytes per rank; on a tie the one leaving fewer pending reductions (partial axes) in its
    output, then the earlier one (rules list their preferred choice first)."""
    best, best_key = None, (float("inf"), 0)
    for cand in candidates:
        cost = sum(redistribution_bytes(g, r, s) for g, r, s in zip(given, cand[0], shapes))
        key = (cost, len(cand[1].partial))
        if key < best_key:
            best, best_key = cand, key
    if best is None:
        raise RuleError("no valid input layouts found (no redistribution reaches any candidate)")
    return best


def prod(xs: Iterable[int]) -> int:
    n = 1
    for x in xs:
        n *= x
    return n
