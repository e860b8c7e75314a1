"""Pipeline stages and which pipeline rank runs each of them.

With ``pp`` ranks and ``v`` stages per rank there are ``pp * v`` stages, numbered in model order.
A placement is the tuple ``rank_of[stage]``:

* ``"interleaved"`` (alias ``"loop"``, Megatron's virtual pipeline): stage ``s`` on rank
  ``s % pp``; the model loops over the ranks ``v`` times.
* ``"v"``: the loops alternate direction, so stage ``s`` of chunk ``c = s // pp`` sits on rank
  ``s % pp`` for even ``c`` and ``pp - 1 - s % pp`` for odd ``c``. With ``v = 2`` that is the
  V shape of ZBV/DualPipeV: rank 0 holds the first and the last stage, and the turn at the bottom
  of the V (stages ``pp - 1`` and ``pp``) stays on one rank.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Sequence, Tuple, Union

PLACEMENTS = ("interleaved", "loop", "v")
PlacementSpec = Union[str, Sequence[int]]


def _check_positive(owner: str, name: str, value) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{owner}: {name}={value!r} must be a positive integer")


@dataclass(frozen=True)
class StageInfo:
    """What a schedule needs to know about a stage. The runtime's stage objects (holding the
    Cell and the neighbours' ranks) may be passed instead: only these two attributes are read."""
    stage_index: int
    stage_num: int

    def __post_init__(self):
        _check_positive("StageInfo", "stage_num", self.stage_num)
        if not isinstance(self.stage_index, int) or not 0 <= self.stage_index < self.stage_num:
            raise ValueError(f"StageInfo: stage_index={self.stage_index!r} must be an integer in "
                             f"[0, {self.stage_num}) for stage_num={self.stage_num}")


def stage_placement(placement: PlacementSpec, pp_size: int, stages_per_rank: int = 1) -> Tuple[int, ...]:
    """``rank_of[stage]`` for a named placement, or an explicit sequence checked for shape."""
    _check_positive("stage_placement", "pp_size", pp_size)
    _check_positive("stage_placement", "stages_per_rank", stages_per_rank)
    stage_num = pp_size * stages_per_rank
    if isinstance(placement, str):
        kind = placement.lower()
        if kind in ("interleaved", "loop"):
            return tuple(s % pp_size for s in range(stage_num))
        if kind == "v":
            return tuple(s % pp_size if (s // pp_size) % 2 == 0 else pp_size - 1 - s % pp_size
                         for s in range(stage_num))
        raise ValueError(f"stage_placement: placement={placement!r}; valid names are {list(PLACEMENTS)} "
                         "or a sequence giving the rank of each stage")
    ranks = tuple(placement)
    if len(ranks) != stage_num or any(not isinstance(r, int) or not 0 <= r < pp_size for r in ranks):
        raise ValueError(f"stage_placement: placement={list(ranks)} must list {stage_num} ranks "
                         f"in [0, {pp_size}) (one per stage)")
    if any(ranks.count(r) != stages_per_rank for r in range(pp_size)):
        raise ValueError(f"stage_placement: placement={list(ranks)} must give every rank exactly "
                         f"{stages_per_rank} stage(s)")
    return ranks


def stages_of_rank(rank: int, pp_size: int, stages_per_rank: int = 1,
                   placement: PlacementSpec = "interleaved") -> List[StageInfo]:
    """The stages pipeline rank ``rank`` runs, in model order (what a rank builds and passes
    to a schedule)."""
    rank_of = stage_placement(placement, pp_size, stages_per_rank)
    if not isinstance(rank, int) or not 0 <= rank < pp_size:
        raise ValueError(f"stages_of_rank: rank={rank!r} must be in [0, {pp_size}) for pp_size={pp_size}")
    return [StageInfo(s, len(rank_of)) for s, r in enumerate(rank_of) if r == rank]
