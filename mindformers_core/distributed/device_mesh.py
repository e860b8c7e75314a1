"""An n-d grid of ranks with named dimensions, and the groups along any of its dims.

Ranks fill the grid row-major (the last dim varies fastest), like ``mindspore.parallel.Layout``'s
device matrix. Everything except :meth:`DeviceMesh.get_group` is pure arithmetic, so meshes can be
built and inspected for any rank without a process group (pass ``rank=``).
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple, Union

from .env import get_env
from .process_group import ProcessGroup, new_group

DimsArg = Union[str, Sequence[str]]


def check_mesh_spec(owner: str, shape: Sequence[int], names: Sequence[str],
                    rank_list: Optional[Sequence[int]]) -> Tuple[Tuple[int, ...], Tuple[str, ...], List[int]]:
    """Validate a named device grid (sizes, names, ranks); shared by DeviceMesh and Layout."""
    shape, names = tuple(shape), tuple(names)
    if len(shape) != len(names):
        raise ValueError(f"{owner}: shape={shape} has {len(shape)} dims but names={names} has {len(names)}")
    for n, s in zip(names, shape):
        if not isinstance(s, int) or isinstance(s, bool) or s < 1:
            raise ValueError(f"{owner}: size of dim {n!r} is {s!r}; must be a positive integer")
        if not isinstance(n, str) or not n or n == "None":
            raise ValueError(f"{owner}: dim name {n!r} must be a non-empty string other than 'None'")
    if len(set(names)) != len(names):
        raise ValueError(f"{owner}: names={names} repeats a name")
    size = 1
    for s in shape:
        size *= s
    ranks = list(range(size)) if rank_list is None else [int(r) for r in rank_list]
    if len(ranks) != size:
        raise ValueError(f"{owner}: rank_list has {len(ranks)} ranks but shape={shape} needs {size}")
    if len(set(ranks)) != len(ranks):
        raise ValueError(f"{owner}: rank_list={ranks} contains duplicates")
    return shape, names, ranks


class DeviceMesh:
    """``DeviceMesh((2, 2), ("dp", "tp"))``: 4 ranks; ``mesh["tp"]`` is this rank's tp row."""

    def __init__(self, shape: Sequence[int], dim_names: Sequence[str],
                 rank_list: Optional[Sequence[int]] = None, rank: Optional[int] = None) -> None:
        shape, dim_names, rank_list = check_mesh_spec("DeviceMesh", shape, dim_names, rank_list)
        self.shape: Tuple[int, ...] = shape
        self.dim_names: Tuple[str, ...] = dim_names
        self.rank_list: Tuple[int, ...] = tuple(rank_list)
        self._rank = rank
        self._groups: Dict[Tuple[str, ...], ProcessGroup] = {}

    # ---- pure arithmetic -------------------------------------------------------------
    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return len(self.rank_list)

    @property
    def rank(self) -> int:
        """The calling process's global rank (or the ``rank=`` given at construction)."""
        return get_env().rank if self._rank is None else self._rank

    def size_of(self, dims: DimsArg) -> int:
        out = 1
        for d in self._dims(dims):
            out *= self.shape[self.dim_names.index(d)]
        return out

    def _dims(self, dims: DimsArg) -> Tuple[str, ...]:
        names = (dims,) if isinstance(dims, str) else tuple(dims)
        for d in names:
            if d not in self.dim_names:
                raise KeyError(f"DeviceMesh: unknown dim {d!r}; this mesh has dims {list(self.dim_names)}")
        if len(set(names)) != len(names):
            raise ValueError(f"DeviceMesh: dims {names} repeat a name")
        return names

    def coordinate_of(self, rank: int) -> Tuple[int, ...]:
        if rank not in self.rank_list:
            raise ValueError(f"DeviceMesh: rank {rank} is not in this mesh ({list(self.rank_list)})")
        flat = self.rank_list.index(rank)
        coord = []
        for s in reversed(self.shape):
            coord.append(flat % s)
            flat //= s
        return tuple(reversed(coord))

    def get_coordinate(self) -> Tuple[int, ...]:
        """This rank's index along every mesh dim."""
        return self.coordinate_of(self.rank)

    def get_local_rank(self, dim: str) -> int:
        """This rank's index along ``dim``."""
        return self.get_coordinate()[self.dim_names.index(self._dims(dim)[0])]

    def rank_at(self, coord: Sequence[int]) -> int:
        flat = 0
        for c, s in zip(coord, self.shape):
            flat = flat * s + c
        return self.rank_list[flat]

    def group_ranks(self, dims: DimsArg, rank: Optional[int] = None) -> List[int]:
        """Ranks sharing ``rank``'s coordinates outside ``dims``, ordered row-major over ``dims``."""
        names = self._dims(dims)
        coord = list(self.coordinate_of(self.rank if rank is None else rank))
        axes = [self.dim_names.index(d) for d in names]
        out = []

        def walk(i):
            if i == len(axes):
                out.append(self.rank_at(coord))
                return
            for v in range(self.shape[axes[i]]):
                coord[axes[i]] = v
                walk(i + 1)

        walk(0)
        return out

    def all_group_ranks(self, dims: DimsArg) -> List[List[int]]:
        """Every group along ``dims`` (one per coordinate of the other dims), in mesh order."""
        seen, groups = set(), []
        for r in self.rank_list:
            g = self.group_ranks(dims, r)
            if g[0] not in seen:
                seen.update(g)
                groups.append(g)
        return groups

    def __getitem__(self, dims: DimsArg) -> "DeviceMesh":
        """Sub-mesh over ``dims`` containing the calling rank (``mesh["dp", "cp"]``)."""
        names = self._dims(dims)
        return DeviceMesh([self.shape[self.dim_names.index(d)] for d in names], names,
                          self.group_ranks(names), rank=self._rank)

    # ---- communication --------------------------------------------------------------
    def get_group(self, dims: Optional[DimsArg] = None) -> ProcessGroup:
        """The calling rank's group along ``dims`` (all dims if None), created on first use."""
        names = self.dim_names if dims is None else self._dims(dims)
        group = self._groups.get(names)
        if group is None:
            group = new_group(self.group_ranks(names))
            self._groups[names] = group
        return group

    def __repr__(self) -> str:
        dims = ", ".join(f"{n}={s}" for n, s in zip(self.dim_names, self.shape))
        return f"DeviceMesh({dims}, ranks={list(self.rank_list)})"


_DEFAULT_MESH: Optional[DeviceMesh] = None


def set_mesh(mesh: Optional[DeviceMesh]) -> None:
    """Set (or clear, with None) the process-wide default mesh."""
    global _DEFAULT_MESH
    if mesh is not None and not isinstance(mesh, DeviceMesh):
        raise TypeError(f"set_mesh: expected a DeviceMesh, got {type(mesh).__name__}")
    _DEFAULT_MESH = mesh


def get_mesh() -> DeviceMesh:
    if _DEFAULT_MESH is None:
        raise RuntimeError("get_mesh: no default mesh; call set_mesh(DeviceMesh(...)) or "
                           "initialize_model_parallel(...) first")
    return _DEFAULT_MESH
