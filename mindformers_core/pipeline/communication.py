"""Turn a compute-only order into a full exec order with explicit, deadlock-free communication.

Built-in schedules only decide the order of FWD/BWD/BWD_INPUT/BWD_WEIGHT per rank; this module adds
the FWD_SEND/FWD_RECV/BWD_SEND/BWD_RECV pairs (and local handoffs between stages of one rank).

Sends and receives are treated as blocking rendezvous (the CPU backend emulates point-to-point
with a two-rank all-reduce, so both sides must arrive). A naive placement (send right after the
producer, receive right before the consumer) deadlocks 1F1B: rank 0 sends forward while rank 1
sends backward. Instead:

1. time the compute order with free communication and unlimited buffering;
2. give every message the earliest moment ``T`` when both ranks are between compute steps (after
   its producer, before its consumer; if no such moment exists, the receiver's first free moment);
3. put each message at ``T`` on both ranks, ordering messages of equal ``T`` by one global key.

Every rank then meets its messages in the same global order, so the order can never deadlock
(the globally first pending message always has both ranks waiting on it), and with the costs the
order was timed with, no rank waits for a peer unless the compute order itself makes it wait.
"""
from __future__ import annotations

from bisect import bisect_left
from typing import Dict, List, Sequence, Tuple

from .costs import StepCosts
from .errors import ScheduleError
from .meta_step import Data, MetaStep, MetaStepType as T, consumes, produces

Timing = Dict[MetaStep, Tuple[float, float]]


def ideal_timeline(compute_order: Dict[int, List[MetaStep]], stage_num: int,
                   costs: StepCosts = StepCosts()) -> Timing:
    """Start and end of every compute step when data moves instantly and nothing blocks."""
    ready: Dict[Data, float] = {}
    timing: Timing = {}
    pos = {r: 0 for r in compute_order}
    clock = {r: 0.0 for r in compute_order}
    progress = True
    while progress:
        progress = False
        for rank, steps in compute_order.items():
            while pos[rank] < len(steps):
                step = steps[pos[rank]]
                needs = consumes(step, stage_num)
                if any(d not in ready for d in needs):
                    break
                start = max([clock[rank]] + [ready[d] for d in needs])
                clock[rank] = start + costs.duration(step)
                timing[step] = (start, clock[rank])
                if produces(step) is not None:
                    ready[produces(step)] = clock[rank]
                pos[rank] += 1
                progress = True
    for rank, steps in compute_order.items():
        if pos[rank] < len(steps):
            step = steps[pos[rank]]
            missing = [d for d in consumes(step, stage_num) if d not in ready]
            raise ScheduleError("order", f"the compute order cannot finish even with unlimited "
                                f"buffering: waits for {missing} that no rank can produce first",
                                rank=rank, index=pos[rank], step=step)
    return timing


def _free_at(intervals: List[Tuple[float, float]], starts: List[float], t: float) -> bool:
    """True when the rank is not in the middle of a compute step at time ``t``."""
    i = bisect_left(starts, t)
    return i == 0 or intervals[i - 1][1] <= t


def add_communication(compute_order: Dict[int, List[MetaStep]], placement: Sequence[int],
                      stage_num: int, costs: StepCosts = StepCosts()) -> Dict[int, List[MetaStep]]:
    """The full exec order: ``compute_order`` plus sends, receives and handoffs (see module doc)."""
    timing = ideal_timeline(compute_order, stage_num, costs)
    intervals = {r: sorted(timing[s] for s in steps) for r, steps in compute_order.items()}
    starts = {r: [a for a, _ in iv] for r, iv in intervals.items()}
    ends = {r: [b for _, b in iv] for r, iv in intervals.items()}
    by_data = {produces(s): s for steps in compute_order.values() for s in steps if produces(s)}

    handoffs: Dict[MetaStep, MetaStep] = {}                   # producer -> handoff after it
    messages: Dict[int, List[Tuple[int, tuple, MetaStep]]] = {r: [] for r in compute_order}
    for (kind, m, s), producer in by_data.items():
        nxt = s + 1 if kind == "act" else s - 1
        if not 0 <= nxt < stage_num:
            continue
        if placement[nxt] == placement[s]:
            handoffs[producer] = MetaStep(m, T.FWD_HANDOFF if kind == "act" else T.BWD_HANDOFF, s)
            continue
        wanted = ((MetaStep(m, T.FWD, nxt),) if kind == "act"
                  else (MetaStep(m, T.BWD, nxt), MetaStep(m, T.BWD_INPUT, nxt)))
        consumer = next((c for c in wanted if c in timing), None)
        if consumer is None:
            raise ScheduleError("complete", f"no {' or '.join(map(repr, wanted))} consumes its output",
                                rank=placement[s], step=producer)
        src, dst = placement[s], placement[nxt]
        t_p, t_c = timing[producer][1], timing[consumer][0]
        both = sorted({t_p} | {e for r in (src, dst) for e in ends[r] if t_p <= e <= t_c})
        free = [t for t in both if _free_at(intervals[src], starts[src], t)
                and _free_at(intervals[dst], starts[dst], t)]
        when = free[0] if free else min(t for t in [t_p] + ends[dst]
                                        if t >= t_p and _free_at(intervals[dst], starts[dst], t))
        key = (when, m, kind == "grad", s)                    # one global order for all ranks
        send = MetaStep(m, T.FWD_SEND if kind == "act" else T.BWD_SEND, s)
        for rank, step in ((src, send), (dst, send.peer())):
            messages[rank].append((bisect_left(starts[rank], when), key, step))

    order: Dict[int, List[MetaStep]] = {}
    for rank, steps in compute_order.items():
        slots: List[List[Tuple[tuple, MetaStep]]] = [[] for _ in range(len(steps) + 1)]
        for slot, key, step in messages[rank]:
            slots[slot].append((key, step))
        out: List[MetaStep] = []
        for i, slot in enumerate(slots):
            out.extend(step for _, step in sorted(slot, key=lambda x: x[0]))
            if i < len(steps):
                out.append(steps[i])
                if steps[i] in handoffs:
                    out.append(handoffs[steps[i]])
        order[rank] = out
    return order
