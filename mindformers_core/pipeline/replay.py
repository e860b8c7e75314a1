"""Replay an exec order step by step: the validator's deadlock check and the simulator's timeline.

Each rank runs its list in order. Compute steps and handoffs never wait (the validator checks that
their inputs come earlier in the same list). Two models for point-to-point:

* ``blocking=True`` (rendezvous): a send waits until the peer reaches the matching receive, and
  both finish together after the send's duration. This is what the CPU backend does (it emulates
  send/recv with a two-rank all-reduce) and the strictest model: an order that finishes here also
  finishes with buffered or asynchronous sends. The validator uses it.
* ``blocking=False`` (asynchronous, like ``isend`` on Ascend/GPU): a send returns at once; its
  receive finishes no earlier than the send's start plus its duration.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, List, Mapping, Sequence, Tuple

from .errors import DeadlockError, ScheduleError
from .meta_step import MetaStep


@dataclass(frozen=True)
class StepTiming:
    step: MetaStep
    start: float
    end: float


def _wait_cycle(stuck: Dict[int, Tuple[int, MetaStep, int]]) -> Tuple[int, ...]:
    """Follow 'rank waits on peer rank' from the lowest stuck rank until a rank repeats."""
    chain: List[int] = []
    rank = min(stuck)
    while rank in stuck and rank not in chain:
        chain.append(rank)
        rank = stuck[rank][2]
    return tuple(chain[chain.index(rank):]) if rank in chain else tuple(chain)


def replay(exec_order: Mapping[int, Sequence[MetaStep]], duration: Callable[[MetaStep], float],
           blocking: bool = True) -> Dict[int, List[StepTiming]]:
    """Per rank, every step with its start and end; raises DeadlockError if ranks get stuck.
    A send or receive starts when its rank reaches it, so waiting for the peer is inside it."""
    where = {step: rank for rank, steps in exec_order.items() for step in steps}
    pos = {r: 0 for r in exec_order}
    clock = {r: 0.0 for r in exec_order}
    out: Dict[int, List[StepTiming]] = {r: [] for r in exec_order}
    sent: Dict[MetaStep, float] = {}          # asynchronous sends posted: send step -> start

    def head(rank):
        return exec_order[rank][pos[rank]] if pos[rank] < len(exec_order[rank]) else None

    def finish(rank, start, end):
        out[rank].append(StepTiming(head(rank), start, end))
        clock[rank] = end
        pos[rank] += 1

    def runs_alone(step):
        return not step.type.is_p2p or (not blocking and step.type.is_send)

    progress = True
    while progress:
        progress = False
        for rank in exec_order:
            while head(rank) is not None and runs_alone(head(rank)):
                step = head(rank)
                if step.type.is_send:
                    sent[step] = clock[rank]
                finish(rank, clock[rank], clock[rank] + (0.0 if step.type.is_send else duration(step)))
                progress = True
        for rank in exec_order:
            step = head(rank)
            if step is None or runs_alone(step):          # may have advanced past a match above
                continue
            peer_rank = where.get(step.peer())
            if peer_rank is None:
                raise ScheduleError("matching", f"no rank has the matching {step.peer()!r}",
                                    rank=rank, index=pos[rank], step=step)
            if not blocking:                              # a receive waits for its posted send
                if step.peer() in sent:
                    start = sent[step.peer()]
                    finish(rank, clock[rank], max(clock[rank], start + duration(step.peer())))
                    progress = True
            elif peer_rank != rank and head(peer_rank) == step.peer():
                end = max(clock[rank], clock[peer_rank]) + max(duration(step), duration(step.peer()))
                finish(rank, clock[rank], end)
                finish(peer_rank, clock[peer_rank], end)
                progress = True
    stuck = {r: (pos[r], head(r), where[head(r).peer()]) for r in exec_order if head(r) is not None}
    if stuck:
        raise DeadlockError(stuck, _wait_cycle(stuck))
    return out
