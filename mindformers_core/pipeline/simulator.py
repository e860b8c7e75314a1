"""Predict a schedule's timeline, bubble and activation memory from per-step costs, before running.

The order is validated, then replayed (``replay``): compute steps take their cost; with blocking
sends/receives a send/recv pair starts when both ranks reach it and takes ``comm_time``; with
posted ones (``blocking_send=False``) a transfer starts when both sides are posted and a wait
step (or a receive without one) ends when it is done. An overlapped FWD_BWD unit takes
``F + B - overlap * min(F, B)`` (``StepCosts``).

* bubble: time a rank does not compute (idle or communicating) over the makespan; the overall
  ratio is summed over ranks. With equal stages and ``comm_time=0``, GPipe and 1F1B give
  ``(p - 1) / (m + p - 1)``.
* in-flight activations: a forward stores its stage's activations for one microbatch (one unit,
  i.e. 1/v of a rank's layers when a rank holds v stages); they are freed when the BWD, or for a
  split backward the BWD_INPUT, of that microbatch and stage ends. A pending BWD_WEIGHT still
  holds part of them (the inputs of the weight matmuls, the output gradients):
  ``peak_until_weight_grad`` counts a unit until the BWD or BWD_WEIGHT ends, the upper bound.
  The true memory of a split-backward schedule lies between the two peaks.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional

from .costs import StepCosts
from .meta_step import INPUT_GRAD_TYPES, MetaStepType as T
from .replay import StepTiming, replay
from .validator import describe_exec_order, validate_schedule


@dataclass(frozen=True)
class Timeline:
    """What ``simulate`` predicts. ``steps[rank]`` lists every step (communication included) in
    execution order with its start and end."""
    steps: Dict[int, List[StepTiming]]
    makespan: float
    bubble_ratio: float
    bubble_per_rank: Dict[int, float]
    peak_in_flight: Dict[int, int]
    peak_in_flight_per_stage: Dict[int, int]
    peak_until_weight_grad: Dict[int, int]


def in_flight_peaks(steps: Dict[int, List[StepTiming]]):
    """Peak (FWD done, input gradient not) per rank and per stage; peak (FWD done, BWD or
    BWD_WEIGHT not) per rank."""
    per_rank, per_stage, until_w = {}, {}, {}
    live_stage: Dict[int, int] = {}
    for rank, timings in steps.items():
        live = held = peak = peak_held = 0
        for t in timings:
            for part in t.step.parts:          # a FWD_BWD unit: its forward, then its backward
                kind, s = part.type, part.stage_index
                if kind is T.FWD:
                    live, held = live + 1, held + 1
                    live_stage[s] = live_stage.get(s, 0) + 1
                    per_stage[s] = max(per_stage.get(s, 0), live_stage[s])
                elif kind in INPUT_GRAD_TYPES:
                    live -= 1
                    live_stage[s] = live_stage.get(s, 0) - 1
                if kind in (T.BWD, T.BWD_WEIGHT):
                    held -= 1
                peak, peak_held = max(peak, live), max(peak_held, held)
        per_rank[rank], until_w[rank] = peak, peak_held
    return per_rank, dict(sorted(per_stage.items())), until_w


def simulate(exec_order, fwd_time: float = 1.0, bwd_time: float = 2.0,
             bwd_input_time: Optional[float] = None, bwd_weight_time: Optional[float] = None,
             comm_time: float = 0.0, blocking_send: bool = True, overlap: float = 0.0) -> Timeline:
    """Simulate a schedule object (anything with ``exec_order``, ``stage_num``,
    ``micro_batch_num`` and ``placement``) or a bare ``{rank: [MetaStep, ...]}`` dict (its stage
    count, microbatch count and placement are then read off the steps).

    ``blocking_send=True`` models sends that wait for their receive (the CPU backend), and the
    order is validated under that model; ``False`` models posted sends and receives (``isend`` /
    ``irecv`` on Ascend/GPU; wait steps complete receives) and validates under that one. See
    ``meta_step`` and ``replay``. ``overlap`` (0..1) credits FWD_BWD units (``StepCosts``)."""
    costs = StepCosts(fwd_time, bwd_time, bwd_input_time, bwd_weight_time, comm_time, overlap)
    if hasattr(exec_order, "exec_order"):
        schedule = exec_order
        exec_order = schedule.exec_order
        validate_schedule(exec_order, schedule.stage_num, schedule.micro_batch_num, schedule.placement,
                          blocking_send=blocking_send, routes=getattr(schedule, "routes", None))
    else:
        validate_schedule(exec_order, *describe_exec_order(exec_order), blocking_send=blocking_send)
    steps = replay(exec_order, costs.duration, blocking=blocking_send)
    makespan = max((t.end for ts in steps.values() for t in ts), default=0.0)
    busy = {r: sum(t.end - t.start for t in ts if t.step.type.is_compute) for r, ts in steps.items()}
    bubble = {r: (1 - b / makespan) if makespan else 0.0 for r, b in busy.items()}
    total = (1 - sum(busy.values()) / (makespan * len(steps))) if makespan else 0.0
    per_rank, per_stage, until_w = in_flight_peaks(steps)
    return Timeline(steps, makespan, total, bubble, per_rank, per_stage, until_w)
