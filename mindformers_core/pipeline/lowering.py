"""Lower an exec order to what the runtime executes today: single compute steps and blocking
send/recv pairs.

The schedule vocabulary has two things a sequential, blocking runtime (the CPU backend) does not
execute directly:

* ``FWD_BWD`` units (DualPipeV): run as the unit's forward, then its backward. Both halves
  found what they need before the unit, so the pair is a valid order in either sequence, and the
  communication around the unit stays where it was (a blocking order remains deadlock-free:
  its per-rank sequence of sends and receives is unchanged).
* posted point-to-point (wait steps, or receives placed where a blocking send would deadlock):
  the compute order is kept and the communication placed again for blocking rendezvous with
  ``add_communication`` (the global-order placement, which cannot deadlock).

``lower_for_runtime`` does both and returns orders that ``validate_schedule(...,
blocking_send=True)`` accepts; an order that needs neither comes back unchanged (same lists).
``PipelineScheduleBase.local_order`` returns this rank's lowered list, so the runtime, which walks
``schedule.local_order``, executes DualPipeV and posted orders as they are lowered here.
"""
from __future__ import annotations

from typing import Dict, List, Mapping, Optional, Sequence

from .communication import add_communication
from .compute_order import compute_only
from .costs import StepCosts
from .errors import DeadlockError
from .meta_step import MetaStep, MetaStepType as T, Routes
from .validator import _resolve_placement, describe_exec_order, validate_schedule
from ..common.placement import PlacementSpec


def split_overlapped(exec_order: Mapping[int, Sequence[MetaStep]]) -> Dict[int, List[MetaStep]]:
    """Every ``FWD_BWD`` unit replaced in place by its forward, then its backward."""
    return {r: [part for step in steps for part in step.parts] for r, steps in exec_order.items()}


def needs_lowering(exec_order: Mapping[int, Sequence[MetaStep]]) -> bool:
    """True if the order holds FWD_BWD units or wait steps."""
    return any(s.type is T.FWD_BWD or s.type.is_wait for steps in exec_order.values() for s in steps)


def lower_for_runtime(exec_order, stage_num: Optional[int] = None, micro_batch_num: Optional[int] = None,
                      placement: Optional[PlacementSpec] = None,
                      costs: StepCosts = StepCosts(), routes: Routes = None) -> Dict[int, List[MetaStep]]:
    """The blocking, single-step form of ``exec_order`` (a schedule object, or a dict with its
    ``stage_num``, ``micro_batch_num`` and ``placement``, read off the steps when not given):
    units split into forward then backward; communication kept if it is deadlock-free under
    blocking send/recv, else placed again with ``add_communication`` (timed with ``costs``).
    ``routes``: the microbatches' routes (``meta_step.Routes``; a schedule's own ``routes``)."""
    if hasattr(exec_order, "exec_order"):
        schedule = exec_order
        exec_order = schedule.exec_order
        stage_num, micro_batch_num, placement = schedule.stage_num, schedule.micro_batch_num, schedule.placement
        routes = getattr(schedule, "routes", None)
    if stage_num is None or micro_batch_num is None:
        found = describe_exec_order(exec_order)
        stage_num = stage_num if stage_num is not None else found[0]
        micro_batch_num = micro_batch_num if micro_batch_num is not None else found[1]
        placement = placement if placement is not None else found[2]
    rank_of = _resolve_placement(placement, list(exec_order), stage_num)
    has_wait = any(s.type.is_wait for steps in exec_order.values() for s in steps)
    if not has_wait:
        single = split_overlapped(exec_order)
        try:
            validate_schedule(single, stage_num, micro_batch_num, rank_of, blocking_send=True, routes=routes)
            unchanged = all(len(single[r]) == len(exec_order[r]) for r in exec_order)
            return {r: list(exec_order[r]) for r in exec_order} if unchanged else single
        except DeadlockError:
            pass
    compute = split_overlapped(compute_only(exec_order))
    return add_communication(compute, rank_of, stage_num, costs, blocking_send=True,
                             micro_batch_num=micro_batch_num, routes=routes)
