"""Tensor layouts in MindSpore's convention, with a placements view and per-rank slices.

``Layout((2, 4), ("dp", "tp"))("dp", "tp")`` splits dim 0 over ``dp`` and dim 1 over ``tp``.
``tensor_map`` counts device axes from the right (last axis = 0) and uses -1 for "not split";
a tuple entry splits one dim over several axes (first listed = outermost). The merged alias
form ``"cp_dp"`` of the design means ``("cp", "dp")``. Layouts may also carry *partial* axes: a
pending reduction (sum, max...) over those mesh axes, which MindSpore's Layout cannot express.

Pure Python: nothing here needs a process group.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple, Union

from ..distributed.device_mesh import check_mesh_spec

NONE = "None"
Entry = Union[str, Tuple[str, ...]]


@dataclass(frozen=True)
class Shard:
    """Placement: this mesh axis splits tensor dim ``dim``."""
    dim: int

    def __repr__(self) -> str:
        return f"Shard({self.dim})"


@dataclass(frozen=True)
class Replicate:
    """Placement: every rank along this mesh axis holds the same data."""

    def __repr__(self) -> str:
        return "Replicate()"


@dataclass(frozen=True)
class Partial:
    """Placement: ranks along this mesh axis hold addends of the value (reduced with ``op``)."""
    op: str = "sum"

    def __post_init__(self):
        if self.op not in ("sum", "avg", "max", "min"):
            raise ValueError(f"Partial: op={self.op!r}; valid ops are 'sum', 'avg', 'max', 'min'")

    def __repr__(self) -> str:
        return f"Partial({self.op!r})"


Placement = Union[Shard, Replicate, Partial]


class Layout:
    """A device matrix with named axes; called with one entry per tensor dim it becomes a tensor
    layout (like ``mindspore.parallel.Layout``)."""

    def __init__(self, device_matrix: Sequence[int], alias_name: Sequence[str],
                 rank_list: Optional[Sequence[int]] = None,
                 axis_groups: Optional[Dict[str, Sequence[str]]] = None) -> None:
        device_matrix, alias_name, ranks = check_mesh_spec("Layout", device_matrix, alias_name, rank_list)
        self.device_matrix: Tuple[int, ...] = device_matrix
        self.alias_name: Tuple[str, ...] = alias_name
        self.rank_list: List[int] = ranks
        self.dims: Optional[Tuple[Tuple[str, ...], ...]] = None   # per tensor dim: split axes
        self.partial: Dict[str, str] = {}                        # axis -> reduce op
        # a name standing for several axes (outermost first): expert parallelism splits data
        # parallel into ("edp", "ep") and keeps "dp" meaning both (see sharding/expert_parallel.py)
        self.axis_groups: Dict[str, Tuple[str, ...]] = {}
        for name, axes in (axis_groups or {}).items():
            axes = tuple(axes)
            if name in alias_name or not axes or any(a not in alias_name for a in axes):
                raise ValueError(f"Layout: axis group {name!r} = {list(axes)} must be a new name over axes of "
                                 f"{list(alias_name)}")
            self.axis_groups[name] = axes

    # ---- building tensor layouts ----------------------------------------------------------
    def _axes_of(self, entry) -> Tuple[str, ...]:
        if isinstance(entry, (tuple, list)):
            out = ()
            for item in entry:
                out += self._axes_of(item)
            return out
        if entry is None or entry == NONE:
            return ()
        if not isinstance(entry, str):
            raise TypeError(f"Layout: entry {entry!r} must be an alias, 'None' or a tuple of aliases")
        if entry in self.alias_name:
            return (entry,)
        if entry in self.axis_groups:
            return self.axis_groups[entry]
        parts = entry.split("_")
        if len(parts) > 1 and all(p in self.alias_name for p in parts):
            return tuple(parts)
        raise ValueError(f"Layout: unknown alias {entry!r}; aliases are {list(self.alias_name)}")

    def __call__(self, *entries: Entry) -> "Layout":
        dims = tuple(self._axes_of(e) for e in entries)
        used = [a for d in dims for a in d]
        for a in used:
            if used.count(a) > 1:
                raise ValueError(f"Layout{tuple(entries)}: mesh axis {a!r} is used more than once")
        out = self._copy()
        out.dims = dims
        out._raw_entries = tuple(entries)
        return out

    def _copy(self) -> "Layout":
        out = Layout.__new__(Layout)
        out.device_matrix, out.alias_name, out.rank_list = self.device_matrix, self.alias_name, self.rank_list
        out.dims, out.partial = self.dims, dict(self.partial)
        out.axis_groups = getattr(self, "axis_groups", {})
        out._raw_entries = getattr(self, "_raw_entries", None)
        return out

    def with_partial(self, axes: Union[str, Sequence[str]], op: str = "sum") -> "Layout":
        """The same layout with pending ``op`` reductions over ``axes``."""
        self._require_tensor()
        axes = (axes,) if isinstance(axes, str) else tuple(axes)
        Partial(op)
        out = self._copy()
        for a in axes:
            if a not in self.alias_name:
                raise ValueError(f"with_partial: unknown axis {a!r}; aliases are {list(self.alias_name)}")
            if a in self.sharded_axes():
                raise ValueError(f"with_partial: axis {a!r} already shards a tensor dim")
            out.partial[a] = op
        return out

    def without_partial(self) -> "Layout":
        out = self._copy()
        out.partial = {}
        return out

    # ---- queries ---------------------------------------------------------------------------
    def _require_tensor(self):
        if self.dims is None:
            raise ValueError("Layout: no tensor map yet; call the layout with one entry per tensor dim, "
                             "e.g. layout('dp', 'None')")

    @property
    def ndim(self) -> int:
        self._require_tensor()
        return len(self.dims)

    def axis_size(self, axis: str) -> int:
        if axis in self.axis_groups:
            n = 1
            for a in self.axis_groups[axis]:
                n *= self.device_matrix[self.alias_name.index(a)]
            return n
        return self.device_matrix[self.alias_name.index(axis)]

    def has_axis(self, name: str) -> bool:
        """True for an axis of the device matrix or an axis group (``"dp"`` = ``("edp", "ep")``)."""
        return name in self.alias_name or name in self.axis_groups

    def axes_of(self, name: str) -> Tuple[str, ...]:
        """The device-matrix axes ``name`` stands for (itself, or an axis group's axes)."""
        return self._axes_of(name)

    def axis_index(self, axis: str) -> int:
        """MindSpore's tensor_map number of ``axis`` (counted from the right)."""
        return len(self.alias_name) - 1 - self.alias_name.index(axis)

    @property
    def tensor_map(self) -> Tuple[Union[int, Tuple[int, ...]], ...]:
        self._require_tensor()
        out = []
        for raw, axes in zip(self._raw_entries or (None,) * len(self.dims), self.dims):
            if isinstance(raw, (tuple, list)) or (len(axes) > 1):
                out.append(tuple(self.axis_index(a) for a in axes) if axes else -1)
            else:
                out.append(self.axis_index(axes[0]) if axes else -1)
        return tuple(out)

    def sharded_axes(self) -> Tuple[str, ...]:
        self._require_tensor()
        return tuple(a for d in self.dims for a in d)

    def split_count(self, dim: int) -> int:
        n = 1
        for a in self.dims[dim]:
            n *= self.axis_size(a)
        return n

    def to_dict(self) -> dict:
        """Same keys and values as ``mindspore.parallel.Layout.to_dict()``."""
        self._require_tensor()
        return {"device_matrix": self.device_matrix, "tensor_map": self.tensor_map,
                "interleaved_parallel": "interleaved_parallel" in self.alias_name,
                "alias_name": self.alias_name, "rank_list": list(self.rank_list)}

    def coordinate(self, rank: int) -> Dict[str, int]:
        """``rank``'s index along every axis of the device matrix (row-major)."""
        if rank not in self.rank_list:
            raise ValueError(f"Layout: rank {rank} is not in rank_list {self.rank_list}")
        flat = self.rank_list.index(rank)
        coord = {}
        for name, size in zip(reversed(self.alias_name), reversed(self.device_matrix)):
            coord[name] = flat % size
            flat //= size
        return coord

    def check_shape(self, shape: Sequence[int], name: str = "tensor") -> None:
        self._require_tensor()
        shape = tuple(shape)
        if len(shape) != len(self.dims):
            raise ValueError(f"{name}: layout has {len(self.dims)} dims ({self.describe()}) but the tensor "
                             f"has shape {shape} ({len(shape)} dims)")
        for d, size in enumerate(shape):
            n = self.split_count(d)
            if size % n:
                raise ValueError(f"{name}: dim {d} of size {size} is not divisible by its split {n} "
                                 f"(axes {list(self.dims[d])})")

    def local_shape(self, shape: Sequence[int]) -> Tuple[int, ...]:
        self.check_shape(shape)
        return tuple(s // self.split_count(d) for d, s in enumerate(shape))

    def shard_index(self, dim: int, rank: int) -> int:
        """Which of the ``split_count(dim)`` chunks of ``dim`` the rank holds (first axis outermost)."""
        coord = self.coordinate(rank)
        idx = 0
        for a in self.dims[dim]:
            idx = idx * self.axis_size(a) + coord[a]
        return idx

    def local_slice(self, shape: Sequence[int], rank: int) -> Tuple[slice, ...]:
        """The slice of the global tensor that ``rank`` holds."""
        local = self.local_shape(shape)
        return tuple(slice(self.shard_index(d, rank) * n, (self.shard_index(d, rank) + 1) * n)
                     for d, n in enumerate(local))

    # ---- placements view -------------------------------------------------------------------
    def placements(self) -> Tuple[Placement, ...]:
        """One placement per device-matrix axis (in alias order)."""
        self._require_tensor()
        out = []
        for axis in self.alias_name:
            dims = [d for d, axes in enumerate(self.dims) if axis in axes]
            if dims:
                out.append(Shard(dims[0]))
            elif axis in self.partial:
                out.append(Partial(self.partial[axis]))
            else:
                out.append(Replicate())
        for d, axes in enumerate(self.dims):
            if list(axes) != sorted(axes, key=self.alias_name.index):
                raise ValueError(f"Layout: dim {d} is split over {list(axes)}, an order the placements view "
                                 f"cannot express (placements nest axes in device-matrix order "
                                 f"{list(self.alias_name)})")
        return tuple(out)

    @classmethod
    def from_placements(cls, device_matrix: Sequence[int], alias_name: Sequence[str],
                        placements: Sequence[Placement], ndim: int,
                        rank_list: Optional[Sequence[int]] = None) -> "Layout":
        base = cls(device_matrix, alias_name, rank_list)
        if len(placements) != len(base.alias_name):
            raise ValueError(f"from_placements: {len(placements)} placements for a device matrix with "
                             f"{len(base.alias_name)} axes {list(base.alias_name)}")
        dims: List[List[str]] = [[] for _ in range(ndim)]
        partial = {}
        for axis, p in zip(base.alias_name, placements):
            if isinstance(p, Shard):
                d = p.dim + ndim if p.dim < 0 else p.dim
                if not 0 <= d < ndim:
                    raise ValueError(f"from_placements: Shard({p.dim}) on axis {axis!r} is out of range "
                                     f"for a {ndim}-dim tensor")
                dims[d].append(axis)
            elif isinstance(p, Partial):
                partial[axis] = p.op
            elif not isinstance(p, Replicate):
                raise TypeError(f"from_placements: {p!r} is not Shard, Replicate or Partial")
        out = base(*[tuple(d) if len(d) > 1 else (d[0] if d else NONE) for d in dims])
        out.partial = partial
        return out

    # ---- misc ------------------------------------------------------------------------------
    def describe(self) -> str:
        if self.dims is None:
            return f"Layout({self.device_matrix}, {self.alias_name})"
        entries = []
        for axes in self.dims:
            entries.append("None" if not axes else ("_".join(axes) if len(axes) > 1 else axes[0]))
        text = "(" + ", ".join(entries) + ")"
        if self.partial:
            text += " partial{" + ", ".join(f"{a}:{op}" for a, op in self.partial.items()) + "}"
        return text

    def __repr__(self) -> str:
        mesh = ", ".join(f"{a}={s}" for a, s in zip(self.alias_name, self.device_matrix))
        return f"Layout[{mesh}]{self.describe() if self.dims is not None else ''}"

    def __eq__(self, other) -> bool:
        if not isinstance(other, Layout):
            return NotImplemented
        return (self.device_matrix == other.device_matrix and self.alias_name == other.alias_name
                and self.rank_list == other.rank_list and self.dims == other.dims
                and self.partial == other.partial)

    def __hash__(self) -> int:
        return hash((self.device_matrix, self.alias_name, tuple(self.rank_list), self.dims,
                     tuple(sorted(self.partial.items()))))


def as_layout(obj) -> Layout:
    """Accept our Layout or a ``mindspore.parallel.Layout`` (with its tensor map set)."""
    if isinstance(obj, Layout):
        return obj
    to_dict = getattr(obj, "to_dict", None)
    if to_dict is None:
        raise TypeError(f"expected a Layout or mindspore.parallel.Layout, got {type(obj).__name__}")
    info = to_dict()
    alias = tuple(info["alias_name"])
    base = Layout(tuple(info["device_matrix"]), alias, info.get("rank_list"))
    entries = []
    for m in info["tensor_map"]:
        if isinstance(m, (tuple, list)):
            entries.append(tuple(NONE if i == -1 else alias[len(alias) - 1 - i] for i in m))
        else:
            entries.append(NONE if m == -1 else alias[len(alias) - 1 - m])
    return base(*entries)
