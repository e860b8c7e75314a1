"""Greedy list scheduling of split-backward steps: how ScheduleZeroBubbleV orders its compute.

Splitting the backward into BWD_INPUT (what the previous stage waits for) and BWD_WEIGHT (what
nobody waits for) lets a schedule fill idle slots with weight gradients. The order comes from
simulating the pipeline with the given costs (and free communication); whenever a rank is free it
picks, among the steps whose inputs are ready:

1. a BWD_INPUT (oldest microbatch first, later stage first): it unblocks the previous stage;
2. a FWD: on a stage that is not the rank's first one always (that microbatch is already
   admitted, and pushing it on reaches the loss sooner), on the rank's first stage only while
   fewer than ``admit_limit[rank]`` microbatches are admitted and not yet through that stage's
   BWD_WEIGHT: this caps activations plus pending weight gradients, like 1F1B's warm-up count;
3. a BWD_WEIGHT (oldest first), the filler.

Each stage runs its forwards, input gradients and weight gradients in microbatch order.
"""
from __future__ import annotations

from typing import Dict, List, Sequence

from .costs import StepCosts
from .errors import ScheduleError
from .meta_step import Data, MetaStep, MetaStepType as T, consumes, produces

_PRIORITY = {T.BWD_INPUT: 0, T.FWD: 1, T.BWD_WEIGHT: 2}


def greedy_split_backward_order(placement: Sequence[int], micro_batch_num: int,
                                admit_limit: Sequence[int],
                                costs: StepCosts = StepCosts(1.0, 2.0)) -> Dict[int, List[MetaStep]]:
    """Compute-only order per rank (FWD, BWD_INPUT, BWD_WEIGHT) built as described above."""
    stage_num, m_num = len(placement), micro_batch_num
    ranks = sorted(set(placement))
    stages = {r: [s for s in range(stage_num) if placement[s] == r] for r in ranks}
    next_mb = {(s, t): 0 for s in range(stage_num) for t in _PRIORITY}   # per stage and type
    ready: Dict[Data, float] = {}
    clock = {r: 0.0 for r in ranks}
    order: Dict[int, List[MetaStep]] = {r: [] for r in ranks}
    remaining = 3 * stage_num * m_num
    now = 0.0

    def admitted(rank):
        first = stages[rank][0]
        return next_mb[(first, T.FWD)] - next_mb[(first, T.BWD_WEIGHT)]

    def candidates(rank):
        for s in stages[rank]:
            for t in _PRIORITY:
                m = next_mb[(s, t)]
                if m >= m_num:
                    continue
                step = MetaStep(m, t, s)
                if any(ready.get(d, float("inf")) > now for d in consumes(step, stage_num)):
                    continue
                if t is T.FWD and s == stages[rank][0] and admitted(rank) >= admit_limit[rank]:
                    continue
                yield step

    while remaining:
        for rank in ranks:
            if clock[rank] > now:
                continue
            pick = min(candidates(rank), default=None,
                       key=lambda st: (_PRIORITY[st.type], st.micro_index, -st.stage_index))
            if pick is None:
                continue
            clock[rank] = now + costs.duration(pick)
            if produces(pick) is not None:
                ready[produces(pick)] = clock[rank]
            order[rank].append(pick)
            next_mb[(pick.stage_index, pick.type)] += 1
            remaining -= 1
        later = [c for c in clock.values() if c > now]
        if remaining and not later:
            raise ScheduleError("order", f"greedy scheduling is stuck at time {now} with {remaining} "
                                f"steps left (admit_limit={list(admit_limit)} too small?)")
        now = min(later, default=now)
    return order
