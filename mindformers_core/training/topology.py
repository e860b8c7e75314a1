"""Where a trainer rank sits: pipeline stage, data-parallel replica, tensor-parallel position.

The layout comes from :class:`~mindformers_core.distributed.rank_generator.RankGenerator`, the
same generator ``initialize_model_parallel`` uses, so the trainer and the model-parallel state give
one answer to "which ranks form a group". ``order`` lists the parallel dimensions from fastest to
slowest varying over consecutive ranks. The default ``"tp-cp-ep-dp-pp"`` (Megatron's order; cp and
ep are 1 here) gives ``rank = pp_rank * dp * tp + dp_rank * tp + tp_rank``: a pipeline stage's
``dp * tp`` ranks are consecutive and the ranks that exchange activations are ``dp * tp`` apart.
Other orders (``"dp-tp-pp"``, ``"tp-pp-dp"``) move the groups onto other ranks; every property below
is read from the generator's coordinates and groups, never from hand arithmetic.
Pure logic: no process group needed.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from ..common.placement import stage_layer_ranges, stage_placement
from ..distributed.rank_generator import PARALLEL_DIMS, RankGenerator
from ..pipeline.schedules import BUILTIN_SCHEDULES

DEFAULT_RANK_ORDER = "tp-cp-ep-dp-pp"


def rank_order_problem(order, sizes: Optional[Mapping[str, int]] = None) -> Optional[str]:
    """Why ``order`` is not a valid rank order (tokens from tp/cp/ep/dp/pp joined by '-', none
    repeated, and every dimension of ``sizes`` larger than 1 named), or None when it is valid."""
    if not isinstance(order, str):
        return f"must be a string of tokens from {list(PARALLEL_DIMS)} joined by '-'"
    tokens = order.split("-")
    if not order or any(not t for t in tokens):
        return f"must be tokens from {list(PARALLEL_DIMS)} joined by '-' (no empty token)"
    unknown = [t for t in tokens if t not in PARALLEL_DIMS]
    if unknown:
        return f"unknown token(s) {unknown}; valid tokens are {list(PARALLEL_DIMS)}"
    repeated = sorted({t for t in tokens if tokens.count(t) > 1}, key=PARALLEL_DIMS.index)
    if repeated:
        return f"repeats {repeated}; each of the valid tokens {list(PARALLEL_DIMS)} may appear once"
    missing = [f"{n}={s}" for n, s in (sizes or {}).items() if s > 1 and n not in tokens]
    if missing:
        return (f"leaves out {', '.join(missing)}; every dimension larger than 1 must be named "
                f"(valid tokens are {list(PARALLEL_DIMS)})")
    return None


@dataclass(frozen=True)
class Topology:
    rank: int
    pp: int
    dp: int
    tp: int
    vpp: int = 1
    scheduler: str = "1f1b"
    order: str = DEFAULT_RANK_ORDER
    cp: int = 1

    def __post_init__(self):
        for name in ("pp", "dp", "tp", "vpp", "cp"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"Topology: {name}={value!r} must be a positive integer")
        problem = rank_order_problem(self.order, {"tp": self.tp, "cp": self.cp, "dp": self.dp, "pp": self.pp})
        if problem:
            raise ValueError(f"Topology: order={self.order!r}: {problem}")
        if not isinstance(self.rank, int) or not 0 <= self.rank < self.world_size:
            raise ValueError(f"Topology: rank={self.rank} must be in [0, {self.world_size}) for "
                             f"pp {self.pp} x dp {self.dp} x cp {self.cp} x tp {self.tp}")
        if self.pp > 1 and self.scheduler not in BUILTIN_SCHEDULES:
            raise ValueError(f"Topology: scheduler={self.scheduler!r}; valid: {sorted(BUILTIN_SCHEDULES)}")
        gen = RankGenerator(tp=self.tp, ep=1, dp=self.dp, pp=self.pp, cp=self.cp, order=self.order)
        # Derived once (the dataclass is frozen): this rank's coordinates and groups.
        object.__setattr__(self, "_generator", gen)
        object.__setattr__(self, "_coord", gen.coordinate(self.rank))
        object.__setattr__(self, "_groups", {token: self._group_of(gen, token) for token in ("tp", "cp", "dp", "pp")})

    def _group_of(self, gen: RankGenerator, token: str) -> List[int]:
        """This rank's group along ``token``, listed by increasing coordinate (the generator's order)."""
        return next(g for g in gen.get_ranks(token) if self.rank in g)

    @property
    def generator(self) -> RankGenerator:
        """The rank generator this topology reads (tp, cp, dp, pp sizes; ep = 1)."""
        return self._generator

    @property
    def coordinate(self) -> Dict[str, int]:
        """This rank's index along every parallel dimension (``tp``, ``cp``, ``ep``, ``dp``, ``pp``)."""
        return dict(self._coord)

    @property
    def world_size(self) -> int:
        return self.pp * self.dp * self.cp * self.tp

    @property
    def per_stage(self) -> int:
        return self.dp * self.cp * self.tp

    @property
    def pp_rank(self) -> int:
        return self._coord["pp"]

    @property
    def dp_rank(self) -> int:
        return self._coord["dp"]

    @property
    def tp_rank(self) -> int:
        return self._coord["tp"]

    @property
    def cp_rank(self) -> int:
        """Context-parallel rank: which slice (storage order) of the sequence this rank holds."""
        return self._coord["cp"]

    @property
    def cp_group_ranks(self) -> List[int]:
        """This rank's context-parallel group; index ``i`` holds context-parallel rank ``i``."""
        return list(self._groups["cp"])

    @property
    def tp_group_ranks(self) -> List[int]:
        """This rank's tensor-parallel group; index ``i`` holds tensor-parallel rank ``i``."""
        return list(self._groups["tp"])

    @property
    def dp_group_ranks(self) -> List[int]:
        """This rank's data-parallel group; index ``i`` holds data-parallel rank ``i``."""
        return list(self._groups["dp"])

    @property
    def pp_ranks(self) -> List[int]:
        """Global rank of each pipeline rank in this rank's pipeline (same dp and tp position)."""
        return list(self._groups["pp"])

    @property
    def stage_ranks(self) -> List[int]:
        """The ``dp * cp * tp`` ranks of this rank's pipeline position (the mesh its stages shard
        over), in row-major (dp, cp, tp) order: index ``(dp_rank * cp + cp_rank) * tp + tp_rank``
        holds the rank with those coordinates. With a non-default order these ranks need not be
        consecutive."""
        gen = self._generator
        out = [-1] * self.per_stage
        for r in self._group_of(gen, "tp-cp-dp"):
            c = gen.coordinate(r)
            out[(c["dp"] * self.cp + c["cp"]) * self.tp + c["tp"]] = r
        return out

    @property
    def placement_kind(self) -> str:
        """ZBV places stages in a V, the other schedules interleave them."""
        return BUILTIN_SCHEDULES[self.scheduler][2] if self.pp > 1 else "interleaved"

    @property
    def dualpipe(self) -> bool:
        """The bidirectional DualPipe: the model's ``pp`` stages held twice (a down and an up copy)."""
        return self.pp > 1 and self.scheduler == "dualpipe"

    @property
    def placement(self) -> Tuple[int, ...]:
        """Pipeline rank of each (virtual) stage the schedule runs. DualPipe: ``2 pp`` stage indices,
        index ``k < pp`` is model stage ``k`` of the down copy (on rank ``k``), index ``pp + k`` model
        stage ``k`` of the up copy (on rank ``pp-1-k``): a V over two chunks per rank."""
        if self.dualpipe:
            return stage_placement("v", self.pp, 2)
        return stage_placement(self.placement_kind, self.pp, self.vpp)

    @property
    def model_stage_num(self) -> int:
        """Stages the model is cut into (``pp * vpp``); DualPipe runs each of them twice."""
        return self.pp * self.vpp

    def model_stage(self, stage: int) -> int:
        """The model stage a schedule stage index runs (itself, except DualPipe's up copy)."""
        return stage % self.model_stage_num if self.dualpipe else stage

    @property
    def model_placement(self) -> Tuple[int, ...]:
        """Pipeline rank of each model stage (DualPipe: of its down copy)."""
        return self.placement[:self.model_stage_num]

    def is_copy(self, stage: int) -> bool:
        """DualPipe's up copy: a second copy of a model stage whose weights the down copy also holds
        (checkpoints save the down copy only)."""
        return self.dualpipe and stage >= self.model_stage_num

    def layer_ranges(self, num_layers: int, layers_per_stage: Sequence) -> List[range]:
        """Global layers of every stage for an explicit ``layers_per_stage`` (counts or ranges)."""
        return stage_layer_ranges(num_layers, self.pp, self.vpp, list(layers_per_stage), self.placement_kind)

    @property
    def stage_num(self) -> int:
        """Stage indices of the schedule: ``pp * vpp``, DualPipe ``2 * pp`` (two copies)."""
        return self.model_stage_num * (2 if self.dualpipe else 1)

    @property
    def stages(self) -> List[int]:
        """Global indices of the stages this rank runs, in model order."""
        return [s for s, r in enumerate(self.placement) if r == self.pp_rank]

    @property
    def holds_first_stage(self) -> bool:
        """This rank runs model stage 0 (the embedding; DualPipe: ranks 0 and pp-1, one copy each)."""
        return any(self.model_stage(s) == 0 for s in self.stages)

    @property
    def holds_last_stage(self) -> bool:
        """This rank runs the last model stage (output layer and loss; DualPipe: ranks 0 and pp-1)."""
        return any(self.model_stage(s) == self.model_stage_num - 1 for s in self.stages)

    def describe(self) -> str:
        return (f"rank {self.rank}: pipeline rank {self.pp_rank} (stages {self.stages} of {self.stage_num}), "
                f"data-parallel rank {self.dp_rank}, tensor-parallel rank {self.tp_rank}"
                + (f", context-parallel rank {self.cp_rank}" if self.cp > 1 else ""))
