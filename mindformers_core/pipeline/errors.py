"""Errors that point at the offending rank and step, so a broken schedule is fixed before launch."""
from __future__ import annotations

from typing import Dict, Optional, Tuple

from .meta_step import MetaStep


class ScheduleError(ValueError):
    """An exec order breaks a rule. ``rank``, ``index`` (position in that rank's list), ``step``
    and ``rule`` say where and which; any of them may be None when the problem has no single place
    (e.g. a step that is missing everywhere)."""

    def __init__(self, rule: str, detail: str, rank: Optional[int] = None,
                 index: Optional[int] = None, step: Optional[MetaStep] = None) -> None:
        self.rule, self.detail, self.rank, self.index, self.step = rule, detail, rank, index, step
        where = []
        if rank is not None:
            where.append(f"rank {rank}")
        if index is not None:
            where.append(f"step {index}")
        if step is not None:
            where.append(repr(step))
        prefix = (", ".join(where) + ": ") if where else ""
        super().__init__(f"{prefix}{detail} [rule: {rule}]")


class DeadlockError(ScheduleError):
    """Blocking sends and receives can never all meet (``blocking=True``), or posted receives wait
    for sends that are never posted (``blocking=False``). ``stuck[rank] = (index, step, peer_rank)``
    says where each unfinished rank waits and on whom; ``cycle`` is a closed chain of ranks
    waiting on each other."""

    def __init__(self, stuck: Dict[int, Tuple[int, MetaStep, int]], cycle: Tuple[int, ...],
                 blocking: bool = True) -> None:
        self.stuck, self.cycle, self.blocking = stuck, cycle, blocking
        lines = []
        for rank, (index, step, peer_rank) in sorted(stuck.items()):
            peer_at = stuck[peer_rank][1] if peer_rank in stuck else None
            lines.append(f"rank {rank} waits at step {index} {step!r} for {step.peer()!r} on rank "
                         f"{peer_rank}" + (f" (which waits at {peer_at!r})" if peer_at else ""))
        chain = " -> ".join(f"rank {r}" for r in cycle + cycle[:1])
        first = cycle[0]
        super().__init__("deadlock",
                         ("blocking send/recv never meet: " if blocking else
                          "posted receives wait for sends that are never posted: ") + "; ".join(lines)
                         + f"; wait cycle: {chain}",
                         rank=first, index=stuck[first][0], step=stuck[first][1])
