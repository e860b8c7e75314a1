"""Built-in schedules. Each decides only the order of compute steps per rank; ``add_communication``
adds the explicit sends, receives and handoffs, so every built-in order has the same shape as a
hand-written one (like the design's GPipe example) and is validated the same way.

=========================  ==================  =====================================================
schedule                   stages per rank     order on each rank
=========================  ==================  =====================================================
ScheduleGPipe              1                   all forwards, then all backwards
Schedule1F1B               1                   p-1-r forwards, then one forward / one backward
ScheduleInterleaved1F1B    v, interleaved      1F1B over virtual stages, microbatches in groups of p
ScheduleZeroBubbleH1       1                   1F1B, split backward, r weight grads delayed on rank r
ScheduleZeroBubbleV        2, V shape          greedy: input grad > forward (memory-capped) > weight
=========================  ==================  =====================================================

(p: pipeline ranks, r: rank, m: microbatches, v: stages per rank.)
"""
from __future__ import annotations

from typing import Dict, List, Sequence

from .communication import add_communication
from .costs import StepCosts
from .meta_step import MetaStep, MetaStepType as T
from .replay import replay
from .schedule_base import PipelineScheduleMulti, PipelineScheduleSingle
from .zero_bubble import greedy_split_backward_order


def _fill(schedule, compute: Dict[int, List[MetaStep]]) -> None:
    schedule.exec_order.update(add_communication(compute, schedule.placement, schedule.stage_num))


def _blocking_makespan(exec_order: Dict[int, List[MetaStep]]) -> float:
    """Makespan with the default costs and blocking send/recv."""
    return max(t.end for steps in replay(exec_order, StepCosts().duration).values() for t in steps)


class ScheduleGPipe(PipelineScheduleSingle):
    """All forwards, then all backwards: simplest, but every rank holds all m microbatches'
    activations. Same exec order as the design's hand-written GPipe example."""

    def construct_exec_order(self):
        m = self.micro_batch_num
        _fill(self, {s: [MetaStep(i, T.FWD, s) for i in range(m)] + [MetaStep(i, T.BWD, s) for i in range(m)]
                     for s in range(self.stage_num)})


class Schedule1F1B(PipelineScheduleSingle):
    """One forward, one backward: rank r runs min(p-1-r, m) warm-up forwards, then alternates, so
    at most min(p-r, m) microbatches are in flight. Same bubble as GPipe. Any m >= 1 works (with
    m < p the pipeline never fills, and the bubble (p-1)/(m+p-1) is large)."""

    def construct_exec_order(self):
        p, m = self.stage_num, self.micro_batch_num
        compute = {}
        for s in range(p):
            warmup = min(p - 1 - s, m)
            steps = [MetaStep(i, T.FWD, s) for i in range(warmup)]
            for i in range(m - warmup):
                steps += [MetaStep(warmup + i, T.FWD, s), MetaStep(i, T.BWD, s)]
            steps += [MetaStep(i, T.BWD, s) for i in range(m - warmup, m)]
            compute[s] = steps
        _fill(self, compute)


class ScheduleInterleaved1F1B(PipelineScheduleMulti):
    """Megatron's interleaved 1F1B (virtual pipeline): each rank holds v stages, s on rank s % p.

    Microbatches go through a rank's stages in groups of p: forwards run group 1 on chunk 0,
    group 1 on chunk 1, ..., then group 2; backwards mirror it from the last chunk. Rank r warms
    up with 2(p-1-r) + (v-1)p forwards, then alternates. The bubble shrinks v times against 1F1B:
    (p-1)/(v*m + p-1) with equal stages. Needs micro_batch_num to be a multiple of p (Megatron's
    rule): with a partial last group this order can leave a rank waiting for data that comes
    after it in another rank's order.

    With blocking send/recv that warm-up can leave neighbours out of step (for B = 2F whenever
    p % 3 == 2: a send waits for a receiver in the middle of a backward, every period). Odd ranks
    then warm up with one more forward, which lines the ranks up again at the price of one stage
    activation on those ranks; the order kept is the one with the shorter simulated makespan.
    """

    def __init__(self, stages: Sequence, micro_batch_num: int) -> None:
        super().__init__(stages, micro_batch_num, placement="interleaved")

    def construct_exec_order(self):
        p, m = self.pp_size, self.micro_batch_num
        if m % p:
            raise ValueError(f"ScheduleInterleaved1F1B: micro_batch_num={m} must be a multiple of the "
                             f"pipeline size pp_size={p} (microbatches go through the virtual stages in "
                             f"groups of {p}); use {max(p, m // p * p)} or {(m // p + 1) * p}")
        candidates = [self._order(lambda r: 0), self._order(lambda r: r % 2)]
        self.exec_order.update(min(candidates, key=_blocking_makespan))

    def _order(self, extra_warmup) -> Dict[int, List[MetaStep]]:
        p, v, m = self.pp_size, self.stages_per_rank, self.micro_batch_num
        groups = [range(g, g + p) for g in range(0, m, p)]
        compute = {}
        for r in range(p):
            fwd = [MetaStep(i, T.FWD, c * p + r) for g in groups for c in range(v) for i in g]
            bwd = [MetaStep(i, T.BWD, c * p + r) for g in groups for c in reversed(range(v)) for i in g]
            warmup = min(len(fwd), 2 * (p - 1 - r) + (v - 1) * p + extra_warmup(r))
            steps = fwd[:warmup]
            for k in range(len(fwd) - warmup):
                steps += [fwd[warmup + k], bwd[k]]
            compute[r] = steps + bwd[len(fwd) - warmup:]
        return add_communication(compute, self.placement, self.stage_num)


class ScheduleZeroBubbleH1(PipelineScheduleSingle):
    """ZB-H1: 1F1B with the backward split. Rank r runs 1F1B's warm-up, then F(i+w), BWD_INPUT(i)
    and BWD_WEIGHT(i-r): r weight gradients wait on rank r and fill the cool-down, where 1F1B
    idles. Activations in flight stay 1F1B's (p-r); counted until their weight gradient they stay
    <= p, 1F1B's peak. With F = BWD_INPUT = BWD_WEIGHT the bubble drops from (p-1)/(m+p-1) to
    (p-1)/(3m+p-1), about a third."""

    def construct_exec_order(self):
        p, m = self.stage_num, self.micro_batch_num
        compute = {}
        for r in range(p):
            warmup = min(p - 1 - r, m)
            steps = [MetaStep(i, T.FWD, r) for i in range(warmup)]
            weights = iter(MetaStep(i, T.BWD_WEIGHT, r) for i in range(m))
            for i in range(m - warmup):
                steps += [MetaStep(warmup + i, T.FWD, r), MetaStep(i, T.BWD_INPUT, r)]
                if i >= r:
                    steps.append(next(weights))
            for i in range(m - warmup, m):
                steps += [MetaStep(i, T.BWD_INPUT, r), next(weights)]
            compute[r] = steps + list(weights)
        _fill(self, compute)


class ScheduleZeroBubbleV(PipelineScheduleMulti):
    """ZBV: two stages per rank in a V (rank r holds stages r and 2p-1-r, so rank 0 also computes
    the loss), backward split into BWD_INPUT and BWD_WEIGHT. Every rank admits at most p
    microbatches, i.e. 2p stage activations of half a rank's layers each: 1F1B's peak on rank 0,
    for every rank. The order comes from ``zero_bubble.greedy_split_backward_order``. With
    F = BWD_INPUT = BWD_WEIGHT (per stage) the makespan approaches the bound 6m + p - 1 (each rank
    computes 6m, the last one cannot start before p - 1 forwards are done); it reaches it for
    p = 4, m = 8."""

    def __init__(self, stages: Sequence, micro_batch_num: int) -> None:
        stages = list(stages)
        if len(stages) != 2:
            raise ValueError(f"ScheduleZeroBubbleV: got {len(stages)} stage(s) for this rank; ZBV needs "
                             "exactly 2 (rank r holds stages r and 2*pp-1-r)")
        super().__init__(stages, micro_batch_num, placement="v")

    def construct_exec_order(self):
        compute = greedy_split_backward_order(self.placement, self.micro_batch_num,
                                              admit_limit=[self.pp_size] * self.pp_size)
        _fill(self, compute)


# name -> (class, stages per rank, placement): what a config's ``pipeline_scheduler`` selects
BUILTIN_SCHEDULES = {
    "gpipe": (ScheduleGPipe, 1, "interleaved"),
    "1f1b": (Schedule1F1B, 1, "interleaved"),
    "interleaved": (ScheduleInterleaved1F1B, 2, "interleaved"),
    "zb_h1": (ScheduleZeroBubbleH1, 1, "interleaved"),
    "zbv": (ScheduleZeroBubbleV, 2, "v"),
}


def build_schedule(name: str, stages: Sequence, micro_batch_num: int):
    """The built-in schedule ``name`` (a config's ``pipeline_scheduler``) for this rank's
    ``stages`` (``PipelineStage`` objects to run it, ``StageInfo`` to validate or simulate it)."""
    if name not in BUILTIN_SCHEDULES:
        raise ValueError(f"build_schedule: name={name!r}; valid: {sorted(BUILTIN_SCHEDULES)}")
    cls = BUILTIN_SCHEDULES[name][0]
    stages = list(stages)
    if issubclass(cls, PipelineScheduleSingle):
        if len(stages) != 1:
            raise ValueError(f"build_schedule: {name!r} runs one stage per rank, got {len(stages)} "
                             "(pipeline_interleave must be 1)")
        return cls(stages[0], micro_batch_num)
    return cls(stages, micro_batch_num)
