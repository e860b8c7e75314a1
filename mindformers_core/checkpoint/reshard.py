"""Resharding on load: the slice a target rank needs, assembled from whichever saved shards
overlap it, in NumPy.

Every rank can read every file (shared filesystem), so no collectives are needed: a rank reads
only the byte ranges of the saved shards that intersect its own slice. :func:`plan_load`
validates names, shapes, dtypes, coverage and file headers for all requested tensors first;
:func:`execute` reads only after the whole plan is known to be good.
"""
from __future__ import annotations

import difflib
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
from safetensors import safe_open

from ..sharding.layout import Layout, as_layout
from . import format as fmt
from .errors import CheckpointError, Problem, raise_if
from .index import Region, ShardRef, TensorIndex, check_headers, coverage_problems, intersect, volume


@dataclass(frozen=True)
class TensorSpec:
    """What a target wants: the global ``shape``, a ``layout`` (None = the full tensor on every
    rank) and optionally a ``dtype`` that the saved one must equal."""
    shape: Tuple[int, ...]
    layout: Optional[Layout] = None
    dtype: Optional[str] = None

    def region(self, rank: int) -> Optional[Region]:
        """The global slice ``rank`` holds, or None if the layout's rank_list excludes it."""
        if self.layout is None:
            return tuple((0, s) for s in self.shape)
        if rank not in self.layout.rank_list:
            return None
        return tuple((s.start, s.stop) for s in self.layout.local_slice(self.shape, rank))


def normalize_targets(targets: Mapping[str, object], what: str = "targets") -> Dict[str, TensorSpec]:
    """Accept ``name -> TensorSpec | (shape, layout) | (shape, layout, dtype)``; layouts may be
    ours or ``mindspore.parallel.Layout``. Bad entries raise ValueError naming the tensor."""
    if not isinstance(targets, Mapping):
        raise TypeError(f"{what} must be a dict name -> (global shape, Layout or None[, dtype]), "
                        f"got {type(targets).__name__}")
    out = {}
    for name, spec in targets.items():
        if isinstance(spec, TensorSpec):
            shape, layout, dtype = spec.shape, spec.layout, spec.dtype
        elif isinstance(spec, (tuple, list)) and len(spec) in (2, 3):
            shape, layout, dtype = (tuple(spec) + (None,))[:3]
        else:
            raise ValueError(f"{what}[{name!r}] = {spec!r}: expected (global shape, Layout or None) or "
                             f"(global shape, Layout or None, dtype)")
        try:
            shape = tuple(int(s) for s in shape)
        except TypeError:
            raise ValueError(f"{what}[{name!r}]: global shape {shape!r} is not a sequence of ints") from None
        if layout is not None:
            layout = as_layout(layout)
            if layout.partial:
                raise ValueError(f"{what}[{name!r}]: layout {layout!r} has partial axes; a checkpoint holds "
                                 f"reduced values, load with the layout without partial and scale as needed")
            layout.check_shape(shape, name)
        out[name] = TensorSpec(shape, layout, fmt.dtype_name(dtype) if dtype is not None else None)
    return out


@dataclass(frozen=True)
class Read:
    """Copy ``src`` (local index into the shard) of ``shard`` to ``dst`` (index into the result)."""
    shard: ShardRef
    src: Tuple[slice, ...]
    dst: Tuple[slice, ...]


@dataclass
class LoadPlan:
    where: str
    shapes: Dict[str, Tuple[int, ...]]      # result key -> local shape
    dtypes: Dict[str, str]
    reads: Dict[str, List[Read]]


def closest(name: str, candidates: Sequence[str]) -> str:
    near = difflib.get_close_matches(name, list(candidates), n=3, cutoff=0.5)
    return f"closest names in the checkpoint: {near}" if near else "no similar name in the checkpoint"


def plan_load(index: TensorIndex, wanted: Mapping[str, TensorSpec], rank: int, *,
              pool: Sequence[str], strict: bool, required: bool = True) -> LoadPlan:
    """Validate and plan loading checkpoint keys ``wanted`` for ``rank``.

    ``pool`` is the set of checkpoint keys the request is compared with: keys of the pool not
    in ``wanted`` are unexpected (an error when ``strict``); wanted keys missing from the index
    are an error when ``required``.
    """
    problems: List[Problem] = list(index.problems)
    plan = LoadPlan(index.where, {}, {}, {})
    needed: List[ShardRef] = []
    for key, spec in wanted.items():
        e = index.entries.get(key)
        label = key
        if e is None:
            if required:
                problems.append(Problem("missing from the checkpoint", tensor=label,
                                        expected=f"a tensor of global shape {list(spec.shape)}",
                                        found=closest(key, pool)))
            continue
        if e.global_shape != spec.shape:
            problems.append(Problem("global shape mismatch", file=e.source, tensor=label,
                                    expected=str(list(spec.shape)), found=str(list(e.global_shape))))
            continue
        if spec.dtype is not None and spec.dtype != e.dtype:
            problems.append(Problem("dtype mismatch", file=e.source, tensor=label, expected=spec.dtype,
                                    found=e.dtype))
            continue
        region = spec.region(rank)
        if region is None:
            continue                                  # checked, but this rank does not hold it
        gaps = coverage_problems(e, region, for_whom=f"rank {rank}")
        if gaps:
            problems += gaps
            continue
        reads = []
        for s in e.shards:
            part = intersect(s.region, region)
            if part is None or not volume(part):
                continue
            reads.append(Read(s, tuple(slice(a - s0, b - s0) for (a, b), (s0, _) in zip(part, s.region)),
                              tuple(slice(a - t0, b - t0) for (a, b), (t0, _) in zip(part, region))))
            needed.append(s)
        plan.shapes[label], plan.dtypes[label], plan.reads[label] = fmt.shape_of(region), e.dtype, reads
    if strict:
        extra = [k for k in pool if k not in wanted]
        for k in extra:
            e = index.entries[k]
            problems.append(Problem("unexpected tensor in the checkpoint (strict=True; pass strict=False to "
                                    "ignore extra tensors)", file=e.source, tensor=k,
                                    expected="only the requested names",
                                    found=f"{e.dtype}{list(e.global_shape)}"))
    if not problems:
        problems += check_headers(index, needed)
    raise_if(index.where, problems)
    return plan


def execute(plan: LoadPlan) -> Dict[str, np.ndarray]:
    """Read the planned byte ranges and assemble each result (only after :func:`plan_load`)."""
    out: Dict[str, np.ndarray] = {}
    try:
        with ExitStack() as stack:
            handles = {}
            for label, reads in plan.reads.items():
                arr = np.empty(plan.shapes[label], dtype=np.dtype(plan.dtypes[label]))
                for r in reads:
                    f = handles.get(r.shard.path)
                    if f is None:
                        f = handles[r.shard.path] = stack.enter_context(safe_open(r.shard.path, framework="np"))
                    arr[r.dst] = f.get_slice(r.shard.key)[r.src] if r.src else f.get_tensor(r.shard.key)
                out[label] = arr
    except CheckpointError:
        raise
    except Exception as e:
        raise CheckpointError(plan.where, [Problem("reading shard data failed", found=f"{type(e).__name__}: {e}")]) \
            from e
    return out
