"""Replay an exec order step by step: the validator's deadlock check and the simulator's timeline.

Each rank runs its list in order. Compute steps and handoffs never wait (the validator checks that
their inputs come earlier in the same list). Two models for point-to-point (see ``meta_step``):

* ``blocking=True`` (rendezvous): a send waits until the peer reaches the matching receive, and
  both finish together after the send's duration. This is what the CPU backend does (it emulates
  send/recv with a two-rank all-reduce) and the strictest model: an order that finishes here also
  finishes with posted sends. Wait steps are no-ops.
* ``blocking=False`` (posted, ``isend``/``irecv`` on Ascend/GPU): a send posts and returns at once;
  a receive posts its buffer and returns at once when a wait step for it comes later on its rank,
  else it waits where it stands (a blocking receive). The transfer runs from the moment both sides are posted for the
  send's duration; a wait (or a receive without a wait) ends when the transfer is done.
  Receives meet their own sends here, whatever the post order; the validator's ``pair_order``
  rule checks beforehand that a transport matching per pair in post order would pair them so.
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
    A send, receive or wait starts when its rank reaches it, so waiting for the peer is inside it."""
    where = {step: rank for rank, steps in exec_order.items() for step in steps}
    pos = {r: 0 for r in exec_order}
    clock = {r: 0.0 for r in exec_order}
    out: Dict[int, List[StepTiming]] = {r: [] for r in exec_order}
    posted: Dict[MetaStep, float] = {}        # posted model: send/recv step -> time it was posted

    def head(rank):
        return exec_order[rank][pos[rank]] if pos[rank] < len(exec_order[rank]) else None

    def finish(rank, start, end):
        out[rank].append(StepTiming(head(rank), start, end))
        clock[rank] = end
        pos[rank] += 1

    def blocks(step):
        """Does the step need the peer (else it runs alone)?"""
        t = step.type
        if blocking:
            return t.is_p2p
        return t.is_wait or (t.is_recv and step.wait() not in where)

    def run_alone(rank, step):
        t = step.type
        if t.is_p2p:                                      # posted send, or receive with a wait later
            posted[step] = clock[rank]
            finish(rank, clock[rank], clock[rank])
        elif t.is_wait:                                   # blocking model: the receive did the work
            finish(rank, clock[rank], clock[rank])
        else:
            finish(rank, clock[rank], clock[rank] + duration(step))

    progress = True
    while progress:
        progress = False
        for rank in exec_order:
            while head(rank) is not None and not blocks(head(rank)):
                run_alone(rank, head(rank))
                progress = True
        for rank in exec_order:
            step = head(rank)
            if step is None or not blocks(step):          # may have advanced past a match above
                continue
            send = step.peer()
            peer_rank = where.get(send)
            if peer_rank is None:
                raise ScheduleError("matching", f"no rank has the matching {send!r}",
                                    rank=rank, index=pos[rank], step=step)
            if not blocking:                              # wait for the posted send's transfer
                if send in posted:
                    recv_posted = posted.get(step.recv(), clock[rank]) if step.type.is_wait else clock[rank]
                    done = max(posted[send], recv_posted) + duration(send)
                    finish(rank, clock[rank], max(clock[rank], done))
                    progress = True
            elif peer_rank != rank and head(peer_rank) == send:
                end = max(clock[rank], clock[peer_rank]) + max(duration(step), duration(send))
                finish(rank, clock[rank], end)
                finish(peer_rank, clock[peer_rank], end)
                progress = True
    stuck = {r: (pos[r], head(r), where[head(r).peer()]) for r in exec_order if head(r) is not None}
    if stuck:
        raise DeadlockError(stuck, _wait_cycle(stuck), blocking=blocking)
    return out
