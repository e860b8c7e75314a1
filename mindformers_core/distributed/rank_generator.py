"""Megatron-style orthogonal rank groups from parallel sizes and an order string.

Ranks are laid out as a multi-dimensional grid whose first token in ``order`` varies
fastest (``order="tp-dp-pp"`` means rank = tp_idx + dp_idx*tp + pp_idx*tp*dp). A group of
tokens (e.g. ``"dp"`` or ``"tp-pp"``) collects the ranks that differ only in those
coordinates. Pure Python: no process group is needed.
"""
from __future__ import annotations

from typing import Dict, List, Sequence

PARALLEL_DIMS = ("tp", "cp", "ep", "dp", "pp")


def _prefix_product(sizes: Sequence[int]) -> List[int]:
    out = [1]
    for s in sizes:
        out.append(out[-1] * s)
    return out


def generate_masked_orthogonal_rank_groups(
        world_size: int, parallel_size: Sequence[int], mask: Sequence[bool]) -> List[List[int]]:
    """Groups of ranks that vary only along the masked dimensions.

    ``parallel_size`` lists the dimension sizes, fastest-varying first; ``mask[i]`` selects
    the dimensions a group spans. Every rank lands in exactly one group, and a group's ranks
    are listed in increasing order of their masked coordinate (first masked dim fastest).
    """
    if len(parallel_size) != len(mask):
        raise ValueError(f"parallel_size {list(parallel_size)} and mask {list(mask)} differ in length")
    total = 1
    for s in parallel_size:
        total *= s
    if total != world_size:
        raise ValueError(f"product of parallel sizes {list(parallel_size)} = {total} != world_size {world_size}")
    strides = _prefix_product(parallel_size)[:-1]
    in_group = [(s, st) for s, st, m in zip(parallel_size, strides, mask) if m]
    across = [(s, st) for s, st, m in zip(parallel_size, strides, mask) if not m]

    def offsets(dims):
        offs = [0]
        for size, stride in dims:
            offs = [o + i * stride for i in range(size) for o in offs]
        return offs

    return [[base + o for o in offsets(in_group)] for base in offsets(across)]


class RankGenerator:
    """Orthogonal rank groups for tp/cp/ep/dp/pp sizes laid out by ``order``.

    ``get_ranks("dp")`` returns every data-parallel group; ``get_ranks("tp-pp")`` the groups
    spanning tensor and pipeline dimensions. ``rank_offset`` shifts all ranks (for a
    generator covering a slice of the world, e.g. a separate expert layout).
    """

    def __init__(self, tp: int, ep: int, dp: int, pp: int, cp: int,
                 order: str = "tp-cp-ep-dp-pp", rank_offset: int = 0) -> None:
        sizes = {"tp": tp, "cp": cp, "ep": ep, "dp": dp, "pp": pp}
        for name, size in sizes.items():
            if not isinstance(size, int) or isinstance(size, bool) or size < 1:
                raise ValueError(f"RankGenerator: {name}={size!r} must be a positive integer")
        if ep > 1 and cp > 1:
            raise ValueError(f"RankGenerator: ep={ep} and cp={cp} are both > 1; expert and context "
                             "parallelism cannot share one layout (use separate generators)")
        if not isinstance(rank_offset, int) or rank_offset < 0:
            raise ValueError(f"RankGenerator: rank_offset={rank_offset!r} must be a non-negative integer")
        tokens = [t for t in str(order).lower().split("-") if t]
        unknown = [t for t in tokens if t not in sizes]
        if unknown:
            raise ValueError(f"RankGenerator: order={order!r} has unknown token(s) {unknown}; "
                             f"valid tokens are {list(PARALLEL_DIMS)}")
        if len(set(tokens)) != len(tokens):
            raise ValueError(f"RankGenerator: order={order!r} repeats a token")
        for name in PARALLEL_DIMS:
            if name not in tokens:
                if sizes[name] != 1:
                    raise ValueError(f"RankGenerator: {name}={sizes[name]} > 1 but {name!r} is missing "
                                     f"from order={order!r}")
                tokens.append(name)
        self.tp, self.ep, self.dp, self.pp, self.cp = tp, ep, dp, pp, cp
        self.rank_offset = rank_offset
        self.order = "-".join(tokens)
        self.ordered_names = tokens
        self.ordered_size = [sizes[t] for t in tokens]
        self.name_to_size: Dict[str, int] = sizes
        self.world_size = tp * ep * dp * pp * cp

    def get_mask(self, token: str) -> List[bool]:
        wanted = [t for t in str(token).lower().split("-") if t]
        bad = [t for t in wanted if t not in self.name_to_size]
        if bad or not wanted:
            raise ValueError(f"RankGenerator.get_ranks: token={token!r} must be tokens from "
                             f"{list(PARALLEL_DIMS)} joined by '-'")
        return [name in wanted for name in self.ordered_names]

    def get_ranks(self, token: str) -> List[List[int]]:
        """All groups spanning the dimensions named in ``token`` (e.g. ``"dp"``, ``"tp-pp"``)."""
        groups = generate_masked_orthogonal_rank_groups(self.world_size, self.ordered_size,
                                                        self.get_mask(token))
        if self.rank_offset:
            groups = [[r + self.rank_offset for r in g] for g in groups]
        return groups

    def coordinate(self, rank: int) -> Dict[str, int]:
        """The rank's index along each parallel dimension."""
        local = rank - self.rank_offset
        if not 0 <= local < self.world_size:
            raise ValueError(f"rank {rank} is outside this generator's ranks "
                             f"[{self.rank_offset}, {self.rank_offset + self.world_size})")
        coord = {}
        for name, size in zip(self.ordered_names, self.ordered_size):
            coord[name] = local % size
            local //= size
        return coord

    def __repr__(self) -> str:
        sizes = ", ".join(f"{n}={self.name_to_size[n]}" for n in self.ordered_names)
        return f"RankGenerator({sizes}, order={self.order!r}, rank_offset={self.rank_offset})"
