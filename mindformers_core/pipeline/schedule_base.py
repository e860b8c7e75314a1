"""Schedule base classes: a schedule is the data ``exec_order[rank] = [MetaStep, ...]``.

A subclass only implements ``construct_exec_order()``, filling ``self.exec_order`` for *every*
pipeline rank (each rank builds the same global order, so the validator can check that sends and
receives meet). The constructor validates the result, so a broken schedule is rejected when it is
built, naming the rank and step, before any process group or model exists.

Executing an order (splitting the batch into microbatches, running the stages, point-to-point
transfers, gradient accumulation) is the job of ``runtime.PipelineRuntime``; ``run`` and
``run_microbatches`` delegate to it when the stages are ``PipelineStage`` objects.
"""
from __future__ import annotations

from typing import Dict, List, Sequence

from .lowering import lower_for_runtime, needs_lowering
from .meta_step import MetaStep
from ..common.placement import PlacementSpec, stage_placement
from .validator import validate_schedule


class PipelineScheduleBase:
    """Common part of every schedule.

    ``stages`` are the stages this rank runs (objects with ``stage_index`` and ``stage_num``, such
    as ``StageInfo``); ``placement`` maps stages to ranks (see ``common.placement.stage_placement``).
    Attributes for ``construct_exec_order``: ``stages``, ``stage_num``, ``pp_size``,
    ``stages_per_rank``, ``placement`` (rank of each stage), ``rank``, ``micro_batch_num`` and
    ``exec_order`` (an empty dict to fill, keyed by pipeline rank).

    ``blocking_send`` (class attribute, default True) is the point-to-point model the order is
    validated under: set it to False in a subclass whose order posts sends and receives (wait
    steps, see ``meta_step``). ``exec_order`` is the schedule as data (it may hold FWD_BWD units
    and wait steps); ``local_order`` is what this rank executes (``lowering.lower_for_runtime``).
    """

    blocking_send = True
    # microbatch -> the stages it runs (``meta_step.Routes``); None: one chain, every microbatch
    # through stages 0..stage_num-1. A subclass with several routes (DualPipe) overrides
    # ``make_routes``; the validator, ``add_communication``, the lowering and the runtime follow them.
    routes = None
    # the runtime gave every copy of a model stage (``copies``, DualPipe) its first copy's weights: done
    # once per schedule (``PipelineRuntime.sync_copies``)
    copies_synced = False

    def __init__(self, stages: Sequence, micro_batch_num: int,
                 placement: PlacementSpec = "interleaved") -> None:
        name = type(self).__name__
        stages = list(stages)
        if not stages:
            raise ValueError(f"{name}: stages is empty; pass the stage(s) this rank runs")
        for st in stages:
            if not all(isinstance(getattr(st, a, None), int) for a in ("stage_index", "stage_num")):
                raise TypeError(f"{name}: stage {st!r} needs integer attributes stage_index and "
                                "stage_num (use StageInfo or a pipeline stage)")
        stage_num = stages[0].stage_num
        if any(st.stage_num != stage_num for st in stages):
            raise ValueError(f"{name}: the stages disagree on stage_num "
                             f"({sorted({st.stage_num for st in stages})})")
        if not isinstance(micro_batch_num, int) or isinstance(micro_batch_num, bool) or micro_batch_num < 1:
            raise ValueError(f"{name}: micro_batch_num={micro_batch_num!r} must be a positive integer")
        if stage_num % len(stages):
            raise ValueError(f"{name}: {len(stages)} stages per rank do not divide "
                             f"stage_num={stage_num}; every rank must hold the same number of stages")
        indices = sorted(st.stage_index for st in stages)
        if len(set(indices)) != len(indices):
            raise ValueError(f"{name}: stages {indices} repeat a stage index")
        self.stages = sorted(stages, key=lambda st: st.stage_index)
        self.stage_num = stage_num
        self.stages_per_rank = len(stages)
        self.pp_size = stage_num // len(stages)
        self.placement = stage_placement(placement, self.pp_size, self.stages_per_rank)
        ranks = {self.placement[s] for s in indices}
        if len(ranks) != 1:
            wants = {r: [s for s, q in enumerate(self.placement) if q == r] for r in sorted(ranks)}
            raise ValueError(f"{name}: stages {indices} are not the stages of one rank under placement "
                             f"{placement!r} (pp_size={self.pp_size}); ranks hold {wants}")
        self.rank = ranks.pop()
        self.micro_batch_num = micro_batch_num
        self.routes = self.make_routes()
        self.exec_order: Dict[int, List[MetaStep]] = {}
        self.construct_exec_order()
        validate_schedule(self.exec_order, self.stage_num, self.micro_batch_num, self.placement,
                          blocking_send=self.blocking_send, routes=self.routes)

    def make_routes(self):
        """The microbatches' routes (``meta_step.Routes``); None: one chain through every stage."""
        return None

    def construct_exec_order(self) -> None:
        """Fill ``self.exec_order[rank]`` for every pipeline rank."""
        raise NotImplementedError(f"{type(self).__name__} must implement construct_exec_order()")

    @property
    def local_order(self) -> List[MetaStep]:
        """The steps this rank executes: ``exec_order[rank]``, or, when the order holds FWD_BWD
        units or posted receives with wait steps, its lowering to single steps and blocking
        send/recv (``lowering.lower_for_runtime``, computed once for all ranks)."""
        if not needs_lowering(self.exec_order) and self.blocking_send:
            return self.exec_order[self.rank]
        cached = self.__dict__.get("_lowered")
        if cached is None or cached[0] is not self.exec_order or cached[1] != _fingerprint(self.exec_order):
            cached = (self.exec_order, _fingerprint(self.exec_order), lower_for_runtime(self))
            self.__dict__["_lowered"] = cached
        return cached[2][self.rank]

    def runtime(self, mode: str = "pynative"):
        """The :class:`~.runtime.PipelineRuntime` executing this schedule (stages must be
        ``PipelineStage`` objects; a schedule of ``StageInfo`` can only be validated and simulated)."""
        from .runtime import PipelineRuntime  # the runtime needs MindSpore; schedules do not
        cache = self.__dict__.setdefault("_runtimes", {})
        if mode not in cache:
            cache[mode] = PipelineRuntime(self, mode)
        return cache[mode]

    def run_microbatches(self, micro_inputs=None, micro_labels=None, mode: str = "pynative", side=None):
        """Execute the local order on pre-split microbatches; see ``PipelineRuntime.run_microbatches``."""
        return self.runtime(mode).run_microbatches(micro_inputs, micro_labels, side)

    def run(self, inputs=None, labels=None, mode: str = "pynative", config=None):
        """Split the batch into ``micro_batch_num`` microbatches (``config``: a ``MicrobatchConfig``,
        default split along dim 0) and run one step: returns the loss on the last stage's rank
        (None elsewhere); gradients are in ``stage.grads``."""
        return self.runtime(mode).run(inputs, labels, config)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(pp_size={self.pp_size}, stages_per_rank={self.stages_per_rank}, "
                f"micro_batch_num={self.micro_batch_num}, rank={self.rank})")


def _fingerprint(exec_order) -> tuple:
    return tuple((r, len(steps), tuple(steps[:1] + steps[-1:])) for r, steps in sorted(exec_order.items()))


class PipelineScheduleSingle(PipelineScheduleBase):
    """One stage per rank: ``self.stage`` is this rank's stage and ``exec_order`` is keyed by the
    stage index, which equals the pipeline rank."""

    def __init__(self, stage, micro_batch_num: int) -> None:
        self.stage = stage
        super().__init__([stage], micro_batch_num, placement="interleaved")


class PipelineScheduleMulti(PipelineScheduleBase):
    """Several (virtual) stages per rank: ``exec_order`` is keyed by pipeline rank and each
    MetaStep carries the global index of its virtual stage. ``placement`` is ``"interleaved"``
    (stage s on rank s % pp), ``"v"`` (V shape) or an explicit rank per stage."""

    def __init__(self, stages: Sequence, micro_batch_num: int,
                 placement: PlacementSpec = "interleaved") -> None:
        super().__init__(stages, micro_batch_num, placement)
