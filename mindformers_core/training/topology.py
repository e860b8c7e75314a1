"""Where a trainer rank sits: pipeline stage, data-parallel replica, tensor-parallel position.

The trainer orders ranks pipeline-outermost, then data parallel, then tensor parallel (the
``tp-dp-pp`` order of MindFormers' defaults): rank ``r = pp_rank * dp * tp + dp_rank * tp + tp_rank``.
So a pipeline stage's ``dp * tp`` ranks are consecutive (one mesh per stage) and the ranks that
exchange activations (same dp and tp position, neighbouring stages) are ``dp * tp`` apart.
Pure logic: no process group needed.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Sequence, Tuple

from ..pipeline.schedules import BUILTIN_SCHEDULES
from ..common.placement import stage_layer_ranges, stage_placement


@dataclass(frozen=True)
class Topology:
    rank: int
    pp: int
    dp: int
    tp: int
    vpp: int = 1
    scheduler: str = "1f1b"

    def __post_init__(self):
        for name in ("pp", "dp", "tp", "vpp"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"Topology: {name}={value!r} must be a positive integer")
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"Topology: rank={self.rank} must be in [0, {self.world_size}) for "
                             f"pp {self.pp} x dp {self.dp} x tp {self.tp}")
        if self.pp > 1 and self.scheduler not in BUILTIN_SCHEDULES:
            raise ValueError(f"Topology: scheduler={self.scheduler!r}; valid: {sorted(BUILTIN_SCHEDULES)}")

    @property
    def world_size(self) -> int:
        return self.pp * self.dp * self.tp

    @property
    def per_stage(self) -> int:
        return self.dp * self.tp

    @property
    def pp_rank(self) -> int:
        return self.rank // self.per_stage

    @property
    def dp_rank(self) -> int:
        return self.rank % self.per_stage // self.tp

    @property
    def tp_rank(self) -> int:
        return self.rank % self.tp

    @property
    def stage_ranks(self) -> List[int]:
        """The ``dp * tp`` ranks of this rank's pipeline position (the mesh its stages shard over)."""
        first = self.pp_rank * self.per_stage
        return list(range(first, first + self.per_stage))

    @property
    def pp_ranks(self) -> List[int]:
        """Global rank of each pipeline rank in this rank's pipeline (same dp and tp position)."""
        local = self.rank % self.per_stage
        return [local + k * self.per_stage for k in range(self.pp)]

    @property
    def placement_kind(self) -> str:
        """ZBV places stages in a V, the other schedules interleave them."""
        return BUILTIN_SCHEDULES[self.scheduler][2] if self.pp > 1 else "interleaved"

    @property
    def placement(self) -> Tuple[int, ...]:
        """Pipeline rank of each (virtual) stage."""
        return stage_placement(self.placement_kind, self.pp, self.vpp)

    def layer_ranges(self, num_layers: int, layers_per_stage: Sequence) -> List[range]:
        """Global layers of every stage for an explicit ``layers_per_stage`` (counts or ranges)."""
        return stage_layer_ranges(num_layers, self.pp, self.vpp, list(layers_per_stage), self.placement_kind)

    @property
    def stage_num(self) -> int:
        return self.pp * self.vpp

    @property
    def stages(self) -> List[int]:
        """Global indices of the stages this rank runs, in model order."""
        return [s for s, r in enumerate(self.placement) if r == self.pp_rank]

    def describe(self) -> str:
        return (f"rank {self.rank}: pipeline rank {self.pp_rank} (stages {self.stages} of {self.stage_num}), "
                f"data-parallel rank {self.dp_rank}, tensor-parallel rank {self.tp_rank}")
