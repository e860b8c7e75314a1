"""Built-in schedules. Each decides only the order of compute steps per rank; ``add_communication``
adds the explicit sends, receives and handoffs, so every built-in order has the same shape as a
hand-written one (like the design's GPipe example) and is validated the same way.

=========================  ==================  =====================================================
schedule                   stages per rank     order on each rank
=========================  ==================  =====================================================
ScheduleGPipe              1                   all forwards, then all backwards
Schedule1F1B               1                   p-1-r forwards, then one forward / one backward
ScheduleInterleaved1F1B    v, interleaved      1F1B over virtual stages, microbatches in groups of >= p
ScheduleZeroBubbleH1       1                   1F1B, split backward, r weight grads delayed on rank r
ScheduleZeroBubbleV        2, V shape          greedy: input grad > forward (memory-capped) > weight
ScheduleDualPipeV          2, V shape          DualPipeV: forward of one chunk overlapped with the
                                               backward of the other (FWD_BWD units), see dualpipe
ScheduleDualPipe           2, V shape, two     DualPipe (bidirectional): half the microbatches down a
                           weight copies       copy of the model, half up a second copy, see dualpipe
=========================  ==================  =====================================================

(p: pipeline ranks, r: rank, m: microbatches, v: stages per rank.)
"""
from __future__ import annotations

from typing import Dict, List, Sequence

from .communication import add_communication
from .compute_order import ideal_makespan
from .costs import StepCosts
from .compute_order import ideal_timeline
from .dualpipe import _dual_check, dualpipe_compute_order, dualpipe_routes, dualpipev_compute_order
from .errors import ScheduleError
from .meta_step import MetaStep, MetaStepType as T
from .replay import replay
from .schedule_base import PipelineScheduleMulti, PipelineScheduleSingle
from .zero_bubble import greedy_split_backward_order


def _fill(schedule, compute: Dict[int, List[MetaStep]]) -> None:
    schedule.exec_order.update(add_communication(compute, schedule.placement, schedule.stage_num,
                                                 micro_batch_num=schedule.micro_batch_num))


def microbatch_groups(micro_batch_num: int, pp_size: int) -> List[range]:
    """Interleaved 1F1B's rounds: ``micro_batch_num // pp_size`` groups (at least one) of
    consecutive microbatches, sizes as equal as possible (earlier groups one larger), so every
    group holds at least ``pp_size`` microbatches when there are that many."""
    rounds = max(1, micro_batch_num // pp_size)
    base, extra = divmod(micro_batch_num, rounds)
    out, start = [], 0
    for k in range(rounds):
        size = base + (1 if k < extra else 0)
        out.append(range(start, start + size))
        start += size
    return out


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

    Microbatches go through a rank's stages in groups (``microbatch_groups``: m // p groups of
    consecutive microbatches, as equal as possible, so each holds at least p when m >= p):
    forwards run group 1 on chunk 0, group 1 on chunk 1, ..., then group 2; backwards mirror it
    from the last chunk. Rank r warms up with 2(p-1-r) + (v-1)g forwards (g: the first group's
    size; g = p when p divides m, Megatron's count), then alternates. The bubble shrinks v times
    against 1F1B: (p-1)/(v*m + p-1) with equal stages, for any m >= p (m = 6 or 10 with p = 4
    included: groups [6] and [5, 5]); with m < p the pipeline never fills.

    With blocking send/recv that warm-up can leave neighbours out of step (for B = 2F whenever
    p % 3 == 2: a send waits for a receiver in the middle of a backward, every period). Some
    ranks then warm up with one or two more forwards, which lines the ranks up again at the price
    of a stage activation on those ranks: candidates (odd ranks +1, last rank +1, then a search
    rank by rank) are simulated and the shortest kept. With posted sends the plain warm-up
    already reaches the compute order's ideal makespan (``compute_order()``).
    """

    def __init__(self, stages: Sequence, micro_batch_num: int) -> None:
        super().__init__(stages, micro_batch_num, placement="interleaved")

    def construct_exec_order(self):
        p = self.pp_size
        target = ideal_makespan(self.compute_order(), self.stage_num)
        best = None
        for extra in ([0] * p, [r % 2 for r in range(p)], [0] * (p - 1) + [1]):
            best = _better(best, extra, self._order(extra))
        # still short of the compute order's own makespan: one pass of coordinate search, last
        # rank first, over 0..2 extra warm-up forwards per rank (blocking sends only lose here)
        for r in reversed(range(p)):
            if best[0] <= target:
                break
            for k in (1, 2):
                best = _better(best, best[1][:r] + [k] + best[1][r + 1:], None, self)
        self.exec_order.update(best[2])

    def compute_order(self, extra_warmup=lambda r: 0) -> Dict[int, List[MetaStep]]:
        """The compute steps per rank (before communication); ``extra_warmup(rank)`` forwards
        are added to the warm-up."""
        p, v, m = self.pp_size, self.stages_per_rank, self.micro_batch_num
        groups = microbatch_groups(m, p)
        compute = {}
        for r in range(p):
            fwd = [MetaStep(i, T.FWD, c * p + r) for g in groups for c in range(v) for i in g]
            bwd = [MetaStep(i, T.BWD, c * p + r) for g in groups for c in reversed(range(v)) for i in g]
            warmup = min(len(fwd), 2 * (p - 1 - r) + (v - 1) * len(groups[0]) + extra_warmup(r))
            steps = fwd[:warmup]
            for k in range(len(fwd) - warmup):
                steps += [fwd[warmup + k], bwd[k]]
            compute[r] = steps + bwd[len(fwd) - warmup:]
        return compute

    def _order(self, extra: Sequence[int]) -> Dict[int, List[MetaStep]]:
        return add_communication(self.compute_order(lambda r: extra[r]), self.placement, self.stage_num,
                                 micro_batch_num=self.micro_batch_num)


def _better(best, extra, order, schedule=None):
    """(makespan, extra warm-up per rank, order): the shorter of ``best`` and this candidate."""
    order = order if order is not None else schedule._order(extra)
    cand = (_blocking_makespan(order), list(extra), order)
    return cand if best is None or cand[0] < best[0] else best


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


class ScheduleDualPipeV(PipelineScheduleMulti):
    """DualPipeV (DeepSeek's DualPipe cut in half): two stages per rank in a V as ZBV (rank r
    holds stages r and 2p-1-r, rank 0 computes the loss). In the steady state every step is one
    ``FWD_BWD`` unit: the forward of one chunk overlapped with the full backward of the other, so
    that on hardware that overlaps, one half's communication (MoE all-to-all) hides behind the
    other half's compute; warm-up and cool-down split some backwards (zero bubble). The order and
    its phases: ``dualpipe.dualpipev_compute_order``. Needs micro_batch_num >= 2 * pp_size.

    ``exec_order`` holds the units (validate, simulate and draw them: ``simulate(..., overlap=x)``
    credits the overlap); ``local_order``, what the runtime executes, runs each unit as its
    forward then its backward (``lowering.lower_for_runtime``): on CPU the same numbers.
    Activations: at most 2p + 1 stage activations of half a rank's layers on every rank (the
    simulator's peak; DeepSeek's table gives PP + 1 for PP = 2p stages), one more than ZBV's cap."""

    def __init__(self, stages: Sequence, micro_batch_num: int) -> None:
        stages = list(stages)
        if len(stages) != 2:
            raise ValueError(f"ScheduleDualPipeV: got {len(stages)} stage(s) for this rank; DualPipeV needs "
                             "exactly 2 (rank r holds stages r and 2*pp-1-r)")
        if isinstance(micro_batch_num, int) and not isinstance(micro_batch_num, bool) and micro_batch_num >= 1:
            pp = stages[0].stage_num // 2
            if micro_batch_num < 2 * pp:
                raise ValueError(f"ScheduleDualPipeV: micro_batch_num={micro_batch_num} must be >= 2 * pp_size = "
                                 f"{2 * pp} (pp_size={pp}); use {2 * pp} or more, or ScheduleZeroBubbleV")
        super().__init__(stages, micro_batch_num, placement="v")

    def compute_order(self, overlap: bool = True) -> Dict[int, List[MetaStep]]:
        """The compute steps per rank; ``overlap=False`` runs each unit as its forward, then its backward."""
        try:
            return dualpipev_compute_order(self.pp_size, self.micro_batch_num, overlap)
        except ScheduleError as exc:
            raise ValueError(f"ScheduleDualPipeV: {exc.detail}") from None

    def construct_exec_order(self):
        _fill(self, self.compute_order())


class ScheduleDualPipe(PipelineScheduleMulti):
    """DeepSeek-V3's bidirectional DualPipe, run by the runtime. ``p`` ranks (even) train a model of
    ``p`` stages held twice: stage index ``k < p`` is model stage ``k`` of the down copy (on rank
    ``k``), stage index ``p + k`` model stage ``k`` of the up copy (on rank ``p-1-k``): ZBV's V
    placement over ``2p`` stage indices, so rank ``r`` holds stages ``r`` and ``2p-1-r``.

    Routes (``routes``, ``dualpipe.dualpipe_routes``): microbatches ``0..m/2-1`` (the first half of
    the batch) enter at rank 0 and run the down copy ``0..p-1``, whose stage ``p-1`` (rank ``p-1``)
    computes their loss; microbatches ``m/2..m-1`` (the second half) enter at rank ``p-1`` and run
    the up copy ``p..2p-1``, whose stage ``2p-1`` (rank 0) computes theirs -- as DeepSeek's reference
    (deepseek-ai/DualPipe ``examples/example_dualpipe.py``: rank 0 is given ``full_x.chunk(2)[0]`` and
    the labels ``full_l.chunk(2)[1]``, rank p-1 ``full_x.chunk(2)[1]`` and ``full_l.chunk(2)[0]``).
    Here every rank holding a route end is given the whole batch (``run(inputs, labels)``) and takes
    its half. Each loss is divided by ``m``, so the losses returned on rank 0 and rank ``p-1`` add up
    to the step's loss. No data moves from stage ``p-1`` to ``p``.

    The copies (``copies``: ``(k, p + k)`` per model stage): the runtime gives the up copy the down
    copy's weights when it is built (``PipelineRuntime.sync_copies``), and after every step sums the
    gradients of the two copies of each model stage over the mirror pair of ranks ``{r, p-1-r}``
    (one all-reduce, a process group of the distributed layer; locally in one process), so both copies
    take the same update and stay equal. Two copies: twice the parameter memory (and optimizer
    state) of DualPipeV, as the DeepSeek-V3 report says.

    ``stages``: this rank's two ``PipelineStage`` (stages ``r`` and ``2p-1-r``; both route ends, stage
    ``p-1`` and ``2p-1``, need ``loss_fn``), or all ``2p`` stages in one process, which then runs the
    ``p`` ranks' steps merged in the order of their ideal timeline (the single-process reference).
    ``exec_order`` holds ``FWD_BWD`` units; the runtime runs each as its forward, then its backward.
    Needs even ``p`` and even ``micro_batch_num >= 2p``."""

    def __init__(self, stages: Sequence, micro_batch_num: int) -> None:
        stages = list(stages)
        if not stages or not all(isinstance(getattr(st, "stage_num", None), int) for st in stages):
            raise ValueError("ScheduleDualPipe: pass this rank's 2 stages (or all 2p stages in one process) as "
                             "PipelineStage or StageInfo objects")
        stage_num = stages[0].stage_num
        if stage_num % 2:
            raise ValueError(f"ScheduleDualPipe: stage_num={stage_num} must be 2 x pp_size (a down and an up copy "
                             "of every model stage)")
        p = stage_num // 2
        if len(stages) == 2:
            placement = "v"
        elif len(stages) == stage_num:
            placement = (0,) * stage_num     # one process: every rank's steps on it
        else:
            raise ValueError(f"ScheduleDualPipe: got {len(stages)} stage(s); a rank holds 2 (stage r of the down "
                             f"copy and 2p-1-r of the up copy) or one process all {stage_num}")
        try:
            _dual_check(p, micro_batch_num)
        except ScheduleError as exc:
            raise ValueError(f"ScheduleDualPipe: {exc.detail}") from None
        self.model_stage_num = p
        super().__init__(stages, micro_batch_num, placement=placement)
        self.copies = [(k, p + k) for k in range(p)]
        for st in self.stages:
            if st.stage_index in (p - 1, 2 * p - 1) and hasattr(st, "mark_route_end"):
                st.mark_route_end("ScheduleDualPipe")

    def make_routes(self):
        return dualpipe_routes(self.model_stage_num, self.micro_batch_num)

    def compute_order(self, overlap: bool = True) -> Dict[int, List[MetaStep]]:
        """The compute steps per rank (``dualpipe.dualpipe_compute_order``); in one process, the
        ``p`` ranks' steps merged by their start in the ideal timeline (same start: lower rank first)."""
        order = dualpipe_compute_order(self.model_stage_num, self.micro_batch_num, overlap)
        if self.pp_size > 1:
            return order
        timing = ideal_timeline(order, self.stage_num, routes=self.routes)
        merged = sorted(((timing[st][0], r, i, st) for r, steps in order.items() for i, st in enumerate(steps)),
                        key=lambda x: x[:3])
        return {0: [st for *_, st in merged]}

    def construct_exec_order(self):
        self.exec_order.update(add_communication(self.compute_order(), self.placement, self.stage_num,
                                                 micro_batch_num=self.micro_batch_num, routes=self.routes))


# name -> (class, stages per rank, placement): what a config's ``pipeline_scheduler`` selects
BUILTIN_SCHEDULES = {
    "gpipe": (ScheduleGPipe, 1, "interleaved"),
    "1f1b": (Schedule1F1B, 1, "interleaved"),
    "interleaved": (ScheduleInterleaved1F1B, 2, "interleaved"),
    "zb_h1": (ScheduleZeroBubbleH1, 1, "interleaved"),
    "zbv": (ScheduleZeroBubbleV, 2, "v"),
    "dualpipev": (ScheduleDualPipeV, 2, "v"),
    # the model cut into pp stages held twice: stage indices 0..2p-1 (down copy, then up copy) in a V
    "dualpipe": (ScheduleDualPipe, 2, "v"),
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
