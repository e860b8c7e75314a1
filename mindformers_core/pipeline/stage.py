"""Pipeline stages as a schedule sees them, and the stages one pipeline rank runs.

Which rank runs which stage (the placement) is :func:`mindformers_core.common.placement.stage_placement`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List

from ..common.placement import PlacementSpec, stage_placement


@dataclass(frozen=True)
class StageInfo:
    """What a schedule needs to know about a stage. The runtime's stage objects (holding the
    Cell and the neighbours' ranks) may be passed instead: only these two attributes are read."""
    stage_index: int
    stage_num: int

    def __post_init__(self):
        if not isinstance(self.stage_num, int) or isinstance(self.stage_num, bool) or self.stage_num < 1:
            raise ValueError(f"StageInfo: stage_num={self.stage_num!r} must be a positive integer")
        if not isinstance(self.stage_index, int) or not 0 <= self.stage_index < self.stage_num:
            raise ValueError(f"StageInfo: stage_index={self.stage_index!r} must be an integer in "
                             f"[0, {self.stage_num}) for stage_num={self.stage_num}")


def stages_of_rank(rank: int, pp_size: int, stages_per_rank: int = 1,
                   placement: PlacementSpec = "interleaved") -> List[StageInfo]:
    """The stages pipeline rank ``rank`` runs, in model order (what a rank builds and passes
    to a schedule)."""
    rank_of = stage_placement(placement, pp_size, stages_per_rank)
    if not isinstance(rank, int) or not 0 <= rank < pp_size:
        raise ValueError(f"stages_of_rank: rank={rank!r} must be in [0, {pp_size}) for pp_size={pp_size}")
    return [StageInfo(s, len(rank_of)) for s, r in enumerate(rank_of) if r == rank]
