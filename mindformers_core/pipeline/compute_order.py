"""Compute orders: what a schedule decides before any communication is placed.

A compute order is ``{rank: [MetaStep, ...]}`` holding only FWD, BWD, BWD_INPUT, BWD_WEIGHT and
FWD_BWD steps. ``validate_compute_order`` checks one the way a user's mistakes should be reported,
each naming (rank, step index, microbatch, stage): a microbatch or stage that does not exist, a
step on the wrong rank, a duplicate, a missing forward or backward, a backward before its forward,
and finally data flow: even with free, unlimited buffering every rank must be able to finish (a
rank waiting for data that another rank only produces after waiting for this rank is reported as
that chain, not as a send/recv wait cycle found after communication was added).

``ideal_timeline`` times a compute order with free communication and nothing blocking: its
makespan (``ideal_makespan``) is what any placement of communication can at best reach, and what
posted (non-blocking) point-to-point does reach (``add_communication(..., blocking_send=False)``).
"""
from __future__ import annotations

from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from .costs import StepCosts
from .errors import ScheduleError
from .meta_step import Data, MetaStep, MetaStepType as T, Routes, consumes_all, produces_all, route_of

Timing = Dict[MetaStep, Tuple[float, float]]


def compute_only(exec_order: Mapping[int, Sequence[MetaStep]]) -> Dict[int, List[MetaStep]]:
    """The compute steps of an exec order, per rank (sends, receives, waits, handoffs dropped)."""
    return {r: [s for s in steps if s.type.is_compute] for r, steps in exec_order.items()}


def _where(rank: int, index: int, step: MetaStep) -> Dict:
    return dict(rank=rank, index=index, step=step)


def _what(step: MetaStep) -> str:
    if step.type is T.FWD_BWD:
        b = step.backward
        return (f"(microbatch {step.micro_index}, stage {step.stage_index} forward overlapped with microbatch "
                f"{b.micro_index}, stage {b.stage_index} backward)")
    return f"(microbatch {step.micro_index}, stage {step.stage_index})"


def _producer_name(data: Data) -> str:
    kind, m, s = data
    return f"F{m}@s{s}" if kind == "act" else f"the input gradient of microbatch {m} on stage {s} (B/I{m}@s{s})"


def validate_compute_order(compute_order: Mapping[int, Sequence[MetaStep]], placement: Sequence[int],
                           stage_num: int, micro_batch_num: Optional[int] = None, routes: Routes = None) -> None:
    """Raise ScheduleError naming (rank, step index, microbatch, stage) if ``compute_order`` is not
    a complete, feasible compute order (see the module doc). ``micro_batch_num=None`` takes the
    microbatches named by the order (then a missing microbatch shows as missing steps).
    ``routes`` (microbatch -> its stages, ``meta_step.Routes``): a microbatch runs only the stages
    of its route (default: every stage)."""
    if not isinstance(compute_order, Mapping):
        raise ScheduleError("input", f"compute_order must be a dict rank -> list of MetaStep, "
                            f"got {type(compute_order).__name__}")
    placement = tuple(placement)
    if len(placement) != stage_num:
        raise ScheduleError("input", f"placement={list(placement)} gives {len(placement)} ranks; it needs one "
                            f"rank per stage (stage_num={stage_num})")
    seen: Dict[MetaStep, Tuple[int, int]] = {}
    for rank, steps in compute_order.items():
        for i, step in enumerate(steps):
            if not isinstance(step, MetaStep):
                raise ScheduleError("input", f"{step!r} is a {type(step).__name__}, not a MetaStep", rank=rank, index=i)
            if not step.type.is_compute:
                raise ScheduleError("input", f"a compute order holds FWD, BWD, BWD_INPUT, BWD_WEIGHT and FWD_BWD "
                                    f"steps only; {step.type.name} is communication (add_communication adds it)",
                                    **_where(rank, i, step))
            for part in step.parts:
                m, s = part.micro_index, part.stage_index
                label = f"{_what(step)}: "
                if s >= stage_num:
                    raise ScheduleError("placement", f"{label}stage {s} does not exist (stage_num={stage_num}, "
                                        f"stages 0..{stage_num - 1})", **_where(rank, i, step))
                if micro_batch_num is not None and m >= micro_batch_num:
                    raise ScheduleError("placement", f"{label}microbatch {m} does not exist (micro_batch_num="
                                        f"{micro_batch_num}, microbatches 0..{micro_batch_num - 1})",
                                        **_where(rank, i, step))
                if placement[s] != rank:
                    raise ScheduleError("placement", f"{label}stage {s} lives on rank {placement[s]}, not on "
                                        f"rank {rank}", **_where(rank, i, step))
                if routes is not None and s not in route_of(m, stage_num, routes):
                    route = route_of(m, stage_num, routes)
                    raise ScheduleError("placement", f"{label}microbatch {m} runs the route of stages "
                                        f"{route[0]}..{route[-1]}, not stage {s}" if len(route) else
                                        f"{label}microbatch {m} has no route", **_where(rank, i, step))
                if part in seen:
                    r0, i0 = seen[part]
                    raise ScheduleError("unique", f"{label}{part!r} appears twice (first at rank {r0} step {i0})",
                                        **_where(rank, i, step))
                seen[part] = (rank, i)

    micro = micro_batch_num if micro_batch_num is not None else \
        1 + max((p.micro_index for p in seen), default=-1)
    # every backward-type step needs its forward; every forward needs a backward of one kind
    for rank, steps in compute_order.items():
        for i, step in enumerate(steps):
            for part in step.parts:
                m, s, t = part.micro_index, part.stage_index, part.type
                label = f"{_what(step)}: "
                fwd = MetaStep(m, T.FWD, s)
                full, inp, wgt = (MetaStep(m, k, s) for k in (T.BWD, T.BWD_INPUT, T.BWD_WEIGHT))
                if t is not T.FWD and fwd not in seen:
                    raise ScheduleError("complete", f"{label}{part!r} has no {fwd!r} anywhere: every backward "
                                        f"needs its forward (on rank {placement[s]})", **_where(rank, i, step))
                if t is T.BWD and (inp in seen or wgt in seen):
                    other = inp if inp in seen else wgt
                    raise ScheduleError("complete", f"{label}microbatch {m} of stage {s} has both a full backward "
                                        f"and a split one ({other!r}); use one or the other", **_where(rank, i, step))
                if t is T.BWD_WEIGHT and inp not in seen:
                    raise ScheduleError("complete", f"{label}{part!r} has no {inp!r}: a weight gradient comes with "
                                        "its input gradient", **_where(rank, i, step))
                if t is T.BWD_INPUT and wgt not in seen:
                    raise ScheduleError("complete", f"{label}{part!r} has no {wgt!r}: a split backward needs both "
                                        "halves", **_where(rank, i, step))
                if t is T.FWD and full not in seen and inp not in seen:
                    raise ScheduleError("complete", f"{label}{part!r} has no backward ({full!r}, or {inp!r} and "
                                        f"{wgt!r}) on rank {placement[s]}", **_where(rank, i, step))
    for m in range(micro):
        for s in route_of(m, stage_num, routes):
            if MetaStep(m, T.FWD, s) not in seen:
                raise ScheduleError("complete", f"missing F{m}@s{s} on rank {placement[s]} (microbatch {m}, stage "
                                    f"{s}): every microbatch 0..{micro - 1} runs on every stage"
                                    + (" of its route" if routes is not None else ""))

    # within a rank: what the same rank produces must come first
    for rank, steps in compute_order.items():
        for i, step in enumerate(steps):
            for part in step.parts:
                for need in consumes_all(part, stage_num, routes):
                    producer = _producer_of(need, seen)
                    if producer is None:
                        continue
                    p_rank, p_index = seen[producer]
                    if p_rank == rank and p_index >= i:
                        how = "in the same FWD_BWD unit: its halves must be independent" if p_index == i \
                            else f"at step {p_index}, later"
                        raise ScheduleError("order", f"{_what(step)}: {part!r} needs {producer!r}, which comes "
                                            f"{how} on rank {rank}", **_where(rank, i, step))
    ideal_timeline(compute_order, stage_num, routes=routes)


def _producer_of(data: Data, seen) -> Optional[MetaStep]:
    kind, m, s = data
    if kind == "act":
        return MetaStep(m, T.FWD, s)
    for t in (T.BWD, T.BWD_INPUT):
        if MetaStep(m, t, s) in seen:
            return MetaStep(m, t, s)
    return None


def ideal_timeline(compute_order: Mapping[int, Sequence[MetaStep]], stage_num: int,
                   costs: StepCosts = StepCosts(), consumes=None, routes: Routes = None) -> Timing:
    """Start and end of every compute step when data moves instantly and nothing blocks. Raises
    ScheduleError (rule ``dataflow``) naming the chain of ranks waiting on each other when the
    order cannot finish even so. ``consumes(step) -> data`` replaces the one-chain data flow
    (stage s after s-1 for every microbatch); ``routes`` (``meta_step.Routes``) gives each
    microbatch its own chain of stages, e.g. the two directions of DualPipe."""
    needs_of = consumes if consumes is not None else (lambda step: consumes_all(step, stage_num, routes))
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
                needs = needs_of(step)
                if any(d not in ready for d in needs):
                    break
                start = max([clock[rank]] + [ready[d] for d in needs])
                clock[rank] = start + costs.duration(step)
                timing[step] = (start, clock[rank])
                for d in produces_all(step):
                    ready[d] = clock[rank]
                pos[rank] += 1
                progress = True
    stuck = {r: pos[r] for r, steps in compute_order.items() if pos[r] < len(steps)}
    if stuck:
        made_by = {d: (r, i) for r, steps in compute_order.items() for i, s in enumerate(steps)
                   for d in produces_all(s)}
        lines = []
        for rank in sorted(stuck):
            step = compute_order[rank][stuck[rank]]
            for d in needs_of(step):
                if d in ready:
                    continue
                if d not in made_by:
                    lines.append(f"rank {rank} step {stuck[rank]} {step!r} {_what(step)} needs "
                                 f"{_producer_name(d)}, which no rank computes")
                else:
                    r, i = made_by[d]
                    lines.append(f"rank {rank} step {stuck[rank]} {step!r} {_what(step)} needs "
                                 f"{compute_order[r][i]!r} (rank {r} step {i}), but rank {r} is stuck at step "
                                 f"{stuck[r]} {compute_order[r][stuck[r]]!r}")
                break
        first = min(stuck)
        raise ScheduleError("dataflow", "the compute order cannot finish even with free, unlimited buffering: "
                            + "; ".join(lines), rank=first, index=stuck[first], step=compute_order[first][stuck[first]])
    return timing


def ideal_makespan(compute_order: Mapping[int, Sequence[MetaStep]], stage_num: int,
                   costs: StepCosts = StepCosts(), routes: Routes = None) -> float:
    """The makespan of ``ideal_timeline``: the best any communication placement can reach."""
    return max((end for _, end in ideal_timeline(compute_order, stage_num, costs, routes=routes).values()),
               default=0.0)
