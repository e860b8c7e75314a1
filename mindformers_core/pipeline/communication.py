"""Turn a compute-only order into a full exec order with explicit, deadlock-free communication.

Built-in schedules only decide the order of FWD/BWD/BWD_INPUT/BWD_WEIGHT/FWD_BWD per rank; this
module adds the FWD_SEND/FWD_RECV/BWD_SEND/BWD_RECV pairs (and local handoffs between stages of
one rank, and in the posted model the wait steps). The compute order is checked first
(``compute_order.validate_compute_order``), so a user's mistake is reported as the step that
makes it, not as a wait cycle in the result.

``blocking_send=True`` (default; what the CPU runtime executes): sends and receives are blocking
rendezvous. A naive placement (send right after the producer, receive right before the consumer)
deadlocks 1F1B: rank 0 sends forward while rank 1 sends backward. Instead:

1. time the compute order with free communication and unlimited buffering;
2. give every message the earliest moment ``T`` when both ranks are between compute steps (after
   its producer, before its consumer; if no such moment exists, the receiver's first free moment);
3. put each message at ``T`` on both ranks, ordering messages of equal ``T`` by one global key.

Every rank then meets its messages in the same global order, so the order can never deadlock
(the globally first pending message always has both ranks waiting on it). Some compute orders
cannot reach their ideal makespan this way (a sender would have to wait for a receiver that is
busy whenever the data is ready); posted point-to-point removes that loss.

``blocking_send=False`` (posted: ``isend``/``irecv``): each send right after its producer, each
receive posted on the receiver before the compute step that runs when the data is sent (per the
same timing), and its wait step right before the consumer. A rank then blocks only where its
data is not there yet, so the replay is the compute order's own data flow: it cannot deadlock
and, with free communication, it finishes at ``ideal_makespan``.
"""
from __future__ import annotations

from bisect import bisect_left
from typing import Dict, List, Optional, Sequence, Tuple

from .compute_order import Timing, ideal_timeline, validate_compute_order
from .costs import StepCosts
from .meta_step import MetaStep, MetaStepType as T, Routes, produces_all, route_of

__all__ = ["add_communication", "ideal_timeline"]


def _free_at(intervals: List[Tuple[float, float]], starts: List[float], t: float) -> bool:
    """True when the rank is not in the middle of a compute step at time ``t``."""
    i = bisect_left(starts, t)
    return i == 0 or intervals[i - 1][1] <= t


def add_communication(compute_order: Dict[int, List[MetaStep]], placement: Sequence[int],
                      stage_num: int, costs: StepCosts = StepCosts(), blocking_send: bool = True,
                      micro_batch_num: Optional[int] = None, routes: Routes = None) -> Dict[int, List[MetaStep]]:
    """The full exec order: ``compute_order`` plus sends, receives, handoffs (and, with
    ``blocking_send=False``, waits); see the module doc. ``micro_batch_num`` (optional) lets the
    check name a microbatch that does not exist; ``costs`` time the order for the placement.
    ``routes`` (``meta_step.Routes``): data moves only between stages of a microbatch's route."""
    placement = tuple(placement)
    validate_compute_order(compute_order, placement, stage_num, micro_batch_num, routes)
    timing = ideal_timeline(compute_order, stage_num, costs, routes=routes)
    index = {s: i for steps in compute_order.values() for i, s in enumerate(steps)}
    intervals = {r: [timing[s] for s in steps] for r, steps in compute_order.items()}
    starts = {r: [a for a, _ in iv] for r, iv in intervals.items()}
    container = {part: s for steps in compute_order.values() for s in steps for part in s.parts}
    by_data = {d: s for steps in compute_order.values() for s in steps for d in produces_all(s)}

    handoffs: Dict[MetaStep, List[MetaStep]] = {}              # producer -> handoffs after it
    # rank -> (slot: insert before the compute step of this index, key, step)
    messages: Dict[int, List[Tuple[int, tuple, MetaStep]]] = {r: [] for r in compute_order}
    for (kind, m, s), producer in sorted(by_data.items(), key=lambda x: (timing[x[1]][1], x[0])):
        nxt = s + 1 if kind == "act" else s - 1
        if nxt not in route_of(m, stage_num, routes):
            continue
        if placement[nxt] == placement[s]:
            handoffs.setdefault(producer, []).append(
                MetaStep(m, T.FWD_HANDOFF if kind == "act" else T.BWD_HANDOFF, s))
            continue
        wanted = ((MetaStep(m, T.FWD, nxt),) if kind == "act"
                  else (MetaStep(m, T.BWD, nxt), MetaStep(m, T.BWD_INPUT, nxt)))
        consumer = next(container[c] for c in wanted if c in container)
        src, dst = placement[s], placement[nxt]
        send = MetaStep(m, T.FWD_SEND if kind == "act" else T.BWD_SEND, s)
        recv = send.peer()
        t_p, t_c = timing[producer][1], timing[consumer][0]
        if not blocking_send:
            posted_at = max(0, bisect_left(starts[dst], t_p) - 1)    # before the step running just before t_p
            posted_at = min(posted_at, index[consumer])
            messages[src].append((index[producer] + 1, (0, t_p, m, kind == "grad", s), send))
            messages[dst].append((posted_at, (1, t_p, m, kind == "grad", s), recv))
            messages[dst].append((index[consumer], (2, t_c, m, kind == "grad", s), recv.wait()))
            continue
        ends = {r: [b for _, b in intervals[r]] for r in (src, dst)}
        both = sorted({t_p} | {e for r in (src, dst) for e in ends[r] if t_p <= e <= t_c})
        free = [t for t in both if _free_at(intervals[src], starts[src], t)
                and _free_at(intervals[dst], starts[dst], t)]
        when = free[0] if free else min(t for t in [t_p] + ends[dst]
                                        if t >= t_p and _free_at(intervals[dst], starts[dst], t))
        key = (when, m, kind == "grad", s)                    # one global order for all ranks
        for rank, step in ((src, send), (dst, recv)):
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
                out.extend(handoffs.get(steps[i], ()))
        order[rank] = out
    return order
