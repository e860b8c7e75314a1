"""Plan the collectives that turn one tensor layout into another, cheapest first.

A layout is seen as a state: for each tensor dim, the mesh axes splitting it (outermost
first), plus the axes holding partial values. One step changes one mesh axis:

==================  ===============================================  ===========================
step                effect on axis ``a`` (size n)                    bytes sent per rank (ring)
==================  ===============================================  ===========================
all_reduce          partial -> replicated                            2(n-1)/n * B
reduce_scatter      partial -> innermost split of dim d               (n-1)/n * B
all_gather          innermost split of dim d -> replicated           (n-1) * B
slice               replicated -> innermost split of dim d           0
all_to_all          innermost split of dim d -> innermost of dim e    (n-1)/n * B
zero_partial        replicated -> partial (sum; one rank keeps it)    0
p2p                 same layout, other ranks (pipeline stages)       B
==================  ===============================================  ===========================

``B`` is the rank's local bytes before the step. :func:`plan_redistribution` runs a
shortest-path search over these steps, so every transition (Shard->Replicate, Partial->Shard,
Shard(i)->Shard(j), multi-axis...) gets its cheapest sequence. :func:`apply_plan_numpy`
executes a plan on NumPy shards (the property tests), and ``execute`` in ``dtensor.py`` on real
tensors with the collectives. Pure Python.
"""
from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field
from typing import Dict, FrozenSet, List, Optional, Sequence, Tuple

import numpy as np

from .layout import Layout

Dims = Tuple[Tuple[str, ...], ...]


@dataclass(frozen=True)
class State:
    dims: Dims
    partial: FrozenSet[Tuple[str, str]]  # (axis, op)

    def axis_dim(self, axis: str) -> Optional[int]:
        for d, axes in enumerate(self.dims):
            if axis in axes:
                return d
        return None

    def partial_op(self, axis: str) -> Optional[str]:
        for a, op in self.partial:
            if a == axis:
                return op
        return None


@dataclass(frozen=True)
class Step:
    kind: str            # all_reduce, reduce_scatter, all_gather, slice, all_to_all, zero_partial, p2p
    axis: str            # mesh axis the collective runs over ("" for p2p)
    dim: int = -1        # tensor dim gathered / scattered / sliced (source dim for all_to_all)
    dim_to: int = -1     # target dim of all_to_all
    op: str = "sum"      # reduce op of all_reduce
    bytes_per_rank: int = 0

    def describe(self) -> str:
        if self.kind == "all_to_all":
            return f"all_to_all over {self.axis}: dim {self.dim} -> dim {self.dim_to}"
        if self.kind in ("all_reduce",):
            return f"all_reduce({self.op}) over {self.axis}"
        if self.kind == "p2p":
            return "send/recv to the target ranks"
        if self.kind == "zero_partial":
            return f"make partial over {self.axis} (one rank keeps the value)"
        return f"{self.kind} over {self.axis} on dim {self.dim}"


@dataclass
class RedistributionPlan:
    source: Layout
    target: Layout
    shape: Tuple[int, ...]
    itemsize: int
    steps: List[Step] = field(default_factory=list)

    @property
    def bytes_per_rank(self) -> int:
        return sum(s.bytes_per_rank for s in self.steps)

    def __str__(self) -> str:
        head = (f"redistribute {self.shape} {self.source.describe()} -> {self.target.describe()}: "
                f"{len(self.steps)} step(s), {self.bytes_per_rank} bytes/rank")
        return "\n".join([head] + [f"  {i}. {s.describe()} ({s.bytes_per_rank} B)"
                                   for i, s in enumerate(self.steps, 1)])


def _state(layout: Layout) -> State:
    """Search state; axes of size 1 split nothing and are dropped."""
    keep = {a for a, n in zip(layout.alias_name, layout.device_matrix) if n > 1}
    return State(tuple(tuple(a for a in axes if a in keep) for axes in layout.dims),
                 frozenset((a, op) for a, op in layout.partial.items() if a in keep))


def _local_elems(state: State, shape: Sequence[int], sizes: Dict[str, int]) -> int:
    n = 1
    for d, s in enumerate(shape):
        split = 1
        for a in state.dims[d]:
            split *= sizes[a]
        n *= s // split
    return n


def _divisible(state: State, shape, sizes, d: int, extra: int) -> bool:
    split = extra
    for a in state.dims[d]:
        split *= sizes[a]
    return shape[d] % split == 0


def _neighbours(state: State, shape, sizes, itemsize):
    local_bytes = _local_elems(state, shape, sizes) * itemsize
    ndim = len(shape)
    for axis, n in sizes.items():
        if n == 1:
            continue
        d_now, op = state.axis_dim(axis), state.partial_op(axis)
        if op is not None:
            rest = state.partial - {(axis, op)}
            yield (Step("all_reduce", axis, op=op, bytes_per_rank=2 * (n - 1) * local_bytes // n),
                   State(state.dims, rest))
            if op == "sum":
                for d in range(ndim):
                    if _divisible(state, shape, sizes, d, n):
                        dims = tuple(a + (axis,) if i == d else a for i, a in enumerate(state.dims))
                        yield (Step("reduce_scatter", axis, dim=d,
                                    bytes_per_rank=(n - 1) * local_bytes // n), State(dims, rest))
        elif d_now is not None:
            if state.dims[d_now][-1] != axis:
                continue  # only the innermost split of a dim can be gathered or moved
            dims_wo = tuple(a[:-1] if i == d_now else a for i, a in enumerate(state.dims))
            yield (Step("all_gather", axis, dim=d_now, bytes_per_rank=(n - 1) * local_bytes),
                   State(dims_wo, state.partial))
            for e in range(ndim):
                if e != d_now and _divisible(State(dims_wo, state.partial), shape, sizes, e, n):
                    dims = tuple(a + (axis,) if i == e else a for i, a in enumerate(dims_wo))
                    yield (Step("all_to_all", axis, dim=d_now, dim_to=e,
                                bytes_per_rank=(n - 1) * local_bytes // n), State(dims, state.partial))
        else:
            for d in range(ndim):
                if _divisible(state, shape, sizes, d, n):
                    dims = tuple(a + (axis,) if i == d else a for i, a in enumerate(state.dims))
                    yield Step("slice", axis, dim=d), State(dims, state.partial)
            yield (Step("zero_partial", axis, op="sum"), State(state.dims, state.partial | {(axis, "sum")}))


def plan_redistribution(source: Layout, target: Layout, shape: Sequence[int],
                        itemsize: int = 4) -> RedistributionPlan:
    """Cheapest sequence of steps (bytes per rank, then fewest steps) from ``source`` to ``target``."""
    shape = tuple(int(s) for s in shape)
    source.check_shape(shape, "source")
    target.check_shape(shape, "target")
    if source.device_matrix != target.device_matrix or source.alias_name != target.alias_name:
        raise ValueError(f"redistribution between different device matrices is not supported: "
                         f"{source.device_matrix}{source.alias_name} -> "
                         f"{target.device_matrix}{target.alias_name}")
    plan = RedistributionPlan(source, target, shape, itemsize)
    sizes = dict(zip(source.alias_name, source.device_matrix))
    start, goal = _state(source), _state(target)
    counter = itertools.count()
    frontier = [(0, 0, next(counter), start, [])]
    best = {start: (0, 0)}
    while frontier:
        cost, nsteps, _, state, steps = heapq.heappop(frontier)
        if state == goal:
            plan.steps = list(steps)
            break
        if best.get(state, (cost, nsteps)) < (cost, nsteps):
            continue
        for step, nxt in _neighbours(state, shape, sizes, itemsize):
            key = (cost + step.bytes_per_rank, nsteps + 1)
            if key < best.get(nxt, (float("inf"), 0)):
                best[nxt] = key
                heapq.heappush(frontier, (key[0], key[1], next(counter), nxt, steps + [step]))
    else:
        raise ValueError(f"no redistribution from {source.describe()} to {target.describe()} for shape {shape}")
    if source.rank_list != target.rank_list:
        local = _local_elems(goal, shape, sizes) * itemsize
        plan.steps.append(Step("p2p", "", bytes_per_rank=local))
    return plan


# ---- NumPy execution (reference semantics of every step) -------------------------------------
def _groups(layout: Layout, axis: str) -> List[List[int]]:
    """Ranks differing only along ``axis``, each ordered by their coordinate on it."""
    groups: Dict[tuple, List[Tuple[int, int]]] = {}
    for r in layout.rank_list:
        c = layout.coordinate(r)
        key = tuple(v for k, v in c.items() if k != axis)
        groups.setdefault(key, []).append((c[axis], r))
    return [[r for _, r in sorted(g)] for g in groups.values()]


_NP_REDUCE = {"sum": lambda xs: sum(xs), "avg": lambda xs: sum(xs) / len(xs),
              "max": lambda xs: np.maximum.reduce(xs), "min": lambda xs: np.minimum.reduce(xs)}


def apply_plan_numpy(plan: RedistributionPlan, shards: Dict[int, np.ndarray]) -> Dict[int, np.ndarray]:
    """Run ``plan`` on per-rank NumPy arrays (keyed by global rank); returns the target shards."""
    cur = dict(shards)
    layout = plan.source
    for step in plan.steps:
        if step.kind == "p2p":
            cur = {t: cur[s] for s, t in zip(plan.source.rank_list, plan.target.rank_list)}
            continue
        nxt = {}
        for group in _groups(layout, step.axis):
            xs = [cur[r] for r in group]
            n = len(group)
            for i, r in enumerate(group):
                if step.kind == "all_reduce":
                    nxt[r] = _NP_REDUCE[step.op](xs)
                elif step.kind == "reduce_scatter":
                    nxt[r] = np.split(sum(xs), n, axis=step.dim)[i]
                elif step.kind == "all_gather":
                    nxt[r] = np.concatenate(xs, axis=step.dim)
                elif step.kind == "slice":
                    nxt[r] = np.split(xs[i], n, axis=step.dim)[i]
                elif step.kind == "all_to_all":
                    nxt[r] = np.concatenate([np.split(x, n, axis=step.dim_to)[i] for x in xs], axis=step.dim)
                elif step.kind == "zero_partial":
                    nxt[r] = xs[i] if i == 0 else np.zeros_like(xs[i])
                else:
                    raise ValueError(f"unknown step {step.kind!r}")
        cur = nxt
    return cur
