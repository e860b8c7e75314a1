"""Split a batch into microbatches and merge microbatch outputs, leaf by leaf.

Why: real model inputs are nested (ids, masks, a table every microbatch needs whole, flags), so
"split dim 0" is not enough; each leaf may need its own rule. Inputs, labels and outputs are trees
of tuples, lists and dicts; everything else is a leaf.

Automatic rules (spec ``None``):

* split: a MindSpore Tensor with ndim > 0 is split along dim 0; 0-dim tensors and non-tensors go
  (the same object) to every microbatch.
* merge: tensors with ndim > 0 are concatenated along dim 0, 0-dim tensors averaged, non-tensors
  returned once if every microbatch gave an equal value (else an error).

A spec may sit at any node of the tree: ``TensorChunkSpec(dim)`` splits / concatenates the tensors
below along ``dim`` (on a container it applies to the ndim > 0 tensors inside, the rest stays
automatic), ``ReplicateSpec()`` gives every microbatch the whole value / requires equal values,
a tuple/list/dict mirrors the input one level down (a dict may leave keys out: automatic), and a
callable takes over: ``fn(value, m) -> list of m`` for split, ``fn(list of values) -> value`` for
merge. At the root the callable receives the whole input (or the list of outputs). For merge,
``False`` keeps the per-microbatch list and ``True`` means automatic.
"""
from __future__ import annotations

import dataclasses
import reprlib
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, List, Optional

import numpy as np
import mindspore as ms
from mindspore import Tensor, ops


@dataclass(frozen=True)
class TensorChunkSpec:
    """Split (merge: concatenate) tensors along ``dim``; negative dims count from the end."""
    dim: int

    def __post_init__(self):
        if not isinstance(self.dim, int) or isinstance(self.dim, bool):
            raise TypeError(f"TensorChunkSpec: dim={self.dim!r} must be an int (the dimension to split along)")

    def __repr__(self) -> str:
        return f"TensorChunkSpec({self.dim})"


@dataclass(frozen=True)
class ReplicateSpec:
    """Every microbatch gets the whole value (merge: all values must be equal, one is returned).
    Named so as not to clash with the tensor placement ``mindformers_core.sharding.Replicate``."""

    def __repr__(self) -> str:
        return "ReplicateSpec()"


_SPLIT_SPECS = ("None (automatic), TensorChunkSpec(dim), ReplicateSpec(), a tuple/list/dict of specs "
                "mirroring the input, or a callable (value, micro_batch_num) -> list of micro_batch_num items")
_MERGE_SPECS = ("None or True (automatic), False (keep the per-microbatch list), TensorChunkSpec(dim), "
                "ReplicateSpec(), a tuple/list/dict of specs mirroring the output, or a callable "
                "(list of per-microbatch values) -> merged value")


def _is_replicate(spec) -> bool:
    return spec is ReplicateSpec or isinstance(spec, ReplicateSpec)


def _is_custom(spec) -> bool:
    return callable(spec) and not isinstance(spec, type)


def _is_tree(x) -> bool:
    return isinstance(x, (tuple, list, dict))


def check_spec(spec, field: str, merge: bool = False, path: str = "") -> None:
    """Reject anything that is not a spec, before any data is seen (``field`` names the setting)."""
    if spec is None or isinstance(spec, TensorChunkSpec) or _is_replicate(spec) or _is_custom(spec):
        return
    if merge and isinstance(spec, bool):
        return
    if isinstance(spec, dict):
        for k, v in spec.items():
            check_spec(v, field, merge, f"{path}[{k!r}]")
        return
    if isinstance(spec, (tuple, list)):
        for i, v in enumerate(spec):
            check_spec(v, field, merge, f"{path}[{i}]")
        return
    hint = " (TensorChunkSpec needs a dim: TensorChunkSpec(0))" if spec is TensorChunkSpec else ""
    raise TypeError(f"{field}{path}: {spec!r} of type {type(spec).__name__} is not a microbatch spec{hint}; "
                    f"valid are {_MERGE_SPECS if merge else _SPLIT_SPECS}")


def _children(x, spec, path: str, op: str):
    """``(key, child path, child spec)`` for each child of container ``x`` under ``spec``."""
    keys = list(x.keys()) if isinstance(x, dict) else list(range(len(x)))
    paths = [f"{path}[{k!r}]" if isinstance(x, dict) else f"{path}[{k}]" for k in keys]
    if spec is None or isinstance(spec, TensorChunkSpec):   # applies to everything below
        return [(k, p, spec) for k, p in zip(keys, paths)]
    what = f"a {type(x).__name__} " + (f"with keys {keys}" if isinstance(x, dict) else f"of {len(x)} items")
    if isinstance(x, dict) and isinstance(spec, dict):
        extra = [k for k in spec if k not in x]
        if not extra:
            return [(k, p, spec.get(k)) for k, p in zip(keys, paths)]
        problem = f"the spec has keys {extra} that the input lacks"
    elif not isinstance(x, dict) and isinstance(spec, (tuple, list)):
        if len(spec) == len(x):
            return [(k, p, s) for k, p, s in zip(keys, paths, spec)]
        problem = f"the spec has {len(spec)} entries"
    else:
        problem = f"the spec is a {type(spec).__name__}"
    raise ValueError(f"{op}: the spec at {path} does not match the input structure: the input there is {what} "
                     f"but {problem}; a spec tree mirrors the input (tuples/lists of the same length, dict "
                     "keys a subset of the input's)")


def _rebuild(like, items: List[Any]):
    """A container like ``like`` (dict, namedtuple, tuple or list) holding ``items`` in its order."""
    if isinstance(like, dict):
        pairs = zip(like.keys(), items)
        return OrderedDict(pairs) if isinstance(like, OrderedDict) else dict(pairs)
    if hasattr(like, "_fields"):   # namedtuple
        return type(like)(*items)
    return tuple(items) if isinstance(like, tuple) else list(items)


def _desc(x) -> str:
    return f"tensor of shape {tuple(x.shape)}" if isinstance(x, Tensor) else f"{type(x).__name__} {reprlib.repr(x)}"


# ---- split ----------------------------------------------------------------------------------

def _chunk(x: Tensor, dim: int, m: int, path: str) -> List[Tensor]:
    shape, nd = tuple(x.shape), len(x.shape)
    if not -nd <= dim < nd:
        raise ValueError(f"split_microbatches: {path} of shape {shape} has no dim {dim} (TensorChunkSpec({dim})); "
                         f"valid dims are {-nd}..{nd - 1}")
    dim %= nd
    n = shape[dim]
    if n < m:
        raise ValueError(f"split_microbatches: {path} of shape {shape} has {n} elements along dim {dim}, fewer "
                         f"than micro_batch_num={m}; use micro_batch_num <= {n} or replicate it (ReplicateSpec())")
    if n % m:
        raise ValueError(f"split_microbatches: {path} of shape {shape} cannot be split along dim {dim} into "
                         f"micro_batch_num={m} equal microbatches ({n} % {m} = {n % m}); use a micro_batch_num "
                         f"that divides {n}, or another spec for this leaf (TensorChunkSpec(dim), ReplicateSpec())")
    return list(ops.split(x, n // m, dim))


def _split(x, spec, m: int, path: str, explicit: bool) -> List[Any]:
    """``m`` pieces of ``x``; ``explicit``: ``spec`` was given for exactly this node."""
    if _is_custom(spec):
        parts = spec(x, m)
        if not isinstance(parts, (list, tuple)) or len(parts) != m:
            got = f"{len(parts)} items" if isinstance(parts, (list, tuple)) else type(parts).__name__
            raise ValueError(f"split_microbatches: the custom split for {path} returned {got}; it must return a "
                             f"list of micro_batch_num={m} items")
        return list(parts)
    if _is_replicate(spec):
        return [x] * m
    if _is_tree(x):
        kids = [_split(x[k], s, m, p, not isinstance(spec, TensorChunkSpec)) for k, p, s in
                _children(x, spec, path, "split_microbatches")]
        return [_rebuild(x, [kid[i] for kid in kids]) for i in range(m)]
    if _is_tree(spec):
        raise ValueError(f"split_microbatches: the spec at {path} is a {type(spec).__name__} but the input there is "
                         f"a leaf ({_desc(x)}); a spec tree must mirror the input structure")
    if isinstance(x, Tensor) and x.ndim > 0:
        return _chunk(x, spec.dim if spec is not None else 0, m, path)
    if explicit and isinstance(spec, TensorChunkSpec):
        raise ValueError(f"split_microbatches: {spec!r} at {path}, but it is a {_desc(x)}: only tensors with "
                         "ndim > 0 can be split; use ReplicateSpec() or None (automatic: replicated)")
    return [x] * m


def split_microbatches(args, micro_batch_num: int, spec=None, name: str = "inputs") -> List[Any]:
    """``micro_batch_num`` structures shaped like ``args`` (see the module docstring for the rules).
    ``name`` is the root of the leaf paths in error messages, e.g. ``inputs['ids'][1]``."""
    if not isinstance(micro_batch_num, int) or isinstance(micro_batch_num, bool) or micro_batch_num < 1:
        raise ValueError(f"split_microbatches: micro_batch_num={micro_batch_num!r} must be a positive integer")
    check_spec(spec, f"split spec for {name}")
    return _split(args, spec, micro_batch_num, name, True)


# ---- merge ----------------------------------------------------------------------------------

def _equal(a, b) -> bool:
    if a is b:
        return True
    if isinstance(a, Tensor) or isinstance(b, Tensor):
        return (isinstance(a, Tensor) and isinstance(b, Tensor) and a.shape == b.shape
                and np.array_equal(a.asnumpy(), b.asnumpy()))
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return type(a) is type(b) and np.array_equal(a, b)
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - objects whose == is not a truth value are "different"
        return False


def _one_value(values, path: str):
    for i, v in enumerate(values[1:], 1):
        if not _equal(values[0], v):
            raise ValueError(f"merge_microbatches: {path} differs between microbatches: microbatch 0 gave "
                             f"{_desc(values[0])}, microbatch {i} gave {_desc(v)}; values that are not split "
                             "must be equal to be merged; give this leaf a callable (list of values -> value) "
                             "or False to keep the per-microbatch list")
    return values[0]


def _same_structure(values, path: str) -> None:
    first = values[0]
    for i, v in enumerate(values[1:], 1):
        same = type(v) is type(first) and (list(v.keys()) == list(first.keys()) if isinstance(first, dict)
                                           else len(v) == len(first))
        if not same:
            raise ValueError(f"merge_microbatches: {path} has a different structure in microbatch {i} "
                             f"({_desc(v)}) than in microbatch 0 ({_desc(first)}); every microbatch must "
                             "return the same nesting")


def _concat(values: List[Tensor], dim: int, path: str) -> Tensor:
    shapes = [tuple(v.shape) for v in values]
    nd = len(shapes[0])
    if not -nd <= dim < nd:
        raise ValueError(f"merge_microbatches: {path} of shape {shapes[0]} has no dim {dim}; valid dims are "
                         f"{-nd}..{nd - 1}")
    dim %= nd
    strip = [s[:dim] + s[dim + 1:] if len(s) == nd else None for s in shapes]
    if any(s != strip[0] for s in strip):
        raise ValueError(f"merge_microbatches: cannot concatenate {path} along dim {dim}: the microbatches have "
                         f"shapes {shapes}, which differ in another dim")
    return ops.cat(values, axis=dim)


def _mean(values: List[Tensor], path: str) -> Tensor:
    if any(v.ndim for v in values):
        raise ValueError(f"merge_microbatches: {path} is a 0-dim tensor in some microbatches but not others "
                         f"(shapes {[tuple(v.shape) for v in values]})")
    stacked = ops.stack(values)
    if stacked.dtype not in (ms.float16, ms.float32, ms.float64, ms.bfloat16):
        stacked = stacked.astype(ms.float32)   # the mean of integer scalars is a float
    return stacked.mean()


def _merge(values: List[Any], spec, path: str, explicit: bool):
    if spec is False:
        return list(values)
    if _is_custom(spec):
        return spec(list(values))
    if _is_replicate(spec):
        return _one_value(values, path)
    first = values[0]
    if _is_tree(first):
        _same_structure(values, path)
        spec = None if spec is True else spec
        return _rebuild(first, [_merge([v[k] for v in values], s, p, not isinstance(spec, TensorChunkSpec))
                                for k, p, s in _children(first, spec, path, "merge_microbatches")])
    if _is_tree(spec):
        raise ValueError(f"merge_microbatches: the spec at {path} is a {type(spec).__name__} but the output there "
                         f"is a leaf ({_desc(first)}); a spec tree must mirror the output structure")
    is_tensor = [isinstance(v, Tensor) for v in values]
    if any(is_tensor) and not all(is_tensor):
        raise ValueError(f"merge_microbatches: {path} is a tensor in some microbatches but not in others "
                         f"({[_desc(v) for v in values]})")
    chunk = isinstance(spec, TensorChunkSpec)
    if all(is_tensor) and first.ndim > 0:
        return _concat(values, spec.dim if chunk else 0, path)
    if explicit and chunk:
        raise ValueError(f"merge_microbatches: {spec!r} at {path}, but it is a {_desc(first)}: only tensors "
                         "with ndim > 0 can be concatenated; use None (automatic), ReplicateSpec() or a callable")
    return _mean(values, path) if all(is_tensor) else _one_value(values, path)


def merge_microbatches(outputs, spec=None, name: str = "outputs"):
    """One structure from the list of per-microbatch ``outputs`` (see the module docstring)."""
    if not isinstance(outputs, (list, tuple)) or not outputs:
        raise ValueError(f"merge_microbatches: outputs must be a non-empty list with one entry per microbatch, "
                         f"got {_desc(outputs)}")
    check_spec(spec, f"merge spec for {name}", merge=True)
    return _merge(list(outputs), spec, name, True)


# ---- configuration ----------------------------------------------------------------------------

@dataclass(frozen=True)
class MicrobatchConfig:
    """How a model's inputs and labels are split and its outputs merged.

    Give one per model; a call overrides it with ``config.override(...)``: settings given there
    (not None) win, the rest keep the model's value. Specs are checked when the config is made.
    """
    split_input: Any = None
    split_label: Any = None
    merge_output: Any = None

    def __post_init__(self):
        check_spec(self.split_input, "split_input")
        check_spec(self.split_label, "split_label")
        check_spec(self.merge_output, "merge_output", merge=True)

    def override(self, other: Optional["MicrobatchConfig"] = None, **fields) -> "MicrobatchConfig":
        """A new config: this one with the non-None settings of ``other`` and ``fields`` on top."""
        valid = [f.name for f in dataclasses.fields(self)]
        unknown = sorted(set(fields) - set(valid))
        if unknown:
            raise TypeError(f"MicrobatchConfig.override: unknown setting(s) {unknown}; valid are {valid}")
        if other is not None and not isinstance(other, MicrobatchConfig):
            raise TypeError(f"MicrobatchConfig.override: other must be a MicrobatchConfig, got {type(other).__name__}")
        changes = {k: getattr(other, k) for k in valid if other is not None and getattr(other, k) is not None}
        changes.update({k: v for k, v in fields.items() if v is not None})
        return dataclasses.replace(self, **changes)

    def split_inputs(self, inputs, micro_batch_num: int) -> List[Any]:
        return split_microbatches(inputs, micro_batch_num, self.split_input, name="inputs")

    def split_labels(self, labels, micro_batch_num: int) -> List[Any]:
        return split_microbatches(labels, micro_batch_num, self.split_label, name="labels")

    def merge_outputs(self, outputs):
        return merge_microbatches(outputs, self.merge_output, name="outputs")
