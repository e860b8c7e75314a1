"""DualPipeV's compute order (DeepSeek-V3's DualPipe cut in half, as Sea AI Lab's "cut-in-half").

Placement is ZBV's V: with ``p`` pipeline ranks there are ``2p`` stages, rank ``r`` holds chunk 0
= stage ``r`` and chunk 1 = stage ``2p-1-r``, so rank 0 holds the first stage and the loss. Every
chunk runs its forwards in microbatch order and its backwards in microbatch order. What makes
DualPipeV different from ZBV is the steady state: a forward of one chunk and a full backward of
the other run as ONE overlapped unit (``FWD_BWD``), so that one half's communication (MoE
all-to-all, pipeline transfers) can hide behind the other half's compute; the warm-up and
cool-down split some backwards into input and weight gradients (zero bubble) to fill the gaps.

Phases on rank ``r`` (F0/F1: forward of chunk 0/1, B: full backward, I/W: split backward whose
weight half waits in a first-in first-out queue, ``F0&B1``: one overlapped unit), m >= 2p:

====  ===================  =====================  ==================================================
      repeat               steps                  purpose
====  ===================  =====================  ==================================================
1     2(p-1-r)             F0                     fill the way down the V
2     r+1                  F0 F1                  reach the bottom and start back up
3     p-1-r                I1 W F1                first chunk-1 backwards, weight half at once
4     m-2p+r+1             F0&B1  F1&B0           steady state (the last rank runs its first
                                                  F0, B1 apart)
5     p-1-r                B1  F1&B0              forwards of chunk 1 run out
6     r+1                  B1 B0                  drain; the second half of these backwards is
                                                  split, its weight halves queued
7     p-1-r                W I0                   weight gradients fill the cool-down
8     r+1                  W                      the queue empties
====  ===================  =====================  ==================================================

The counts add up to m forwards and m backwards per chunk. This is an order built from the
published description of the schedule (DeepSeek's DualPipe README and paper), written here as data.
"""
from __future__ import annotations

from collections import deque
from typing import Dict, List, Optional

from .errors import ScheduleError
from .meta_step import MetaStep, MetaStepType as T


def dualpipev_compute_order(pp_size: int, micro_batch_num: int, overlap: bool = True) -> Dict[int, List[MetaStep]]:
    """DualPipeV's compute order per rank (see the module doc); stage ``r`` and ``2p-1-r`` on
    rank ``r``. ``overlap=False`` runs every overlapped unit as its forward, then its backward
    (what a runtime without an overlapped kernel executes)."""
    p, m = pp_size, micro_batch_num
    for name, value in (("pp_size", p), ("micro_batch_num", m)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ScheduleError("input", f"dualpipev_compute_order: {name}={value!r} must be a positive integer")
    if m < 2 * p:
        raise ScheduleError("input", f"DualPipeV: micro_batch_num={m} must be >= 2 * pp_size = {2 * p} (the warm-up "
                            f"alone admits up to 2p microbatches on rank 0); use {2 * p} or more, or zbv")
    order: Dict[int, List[MetaStep]] = {}
    for r in range(p):
        stage = (r, 2 * p - 1 - r)
        nxt = {(c, k): 0 for c in (0, 1) for k in ("F", "B")}
        weights: deque = deque()
        out: List[MetaStep] = []

        def fwd(c):
            step = MetaStep(nxt[(c, "F")], T.FWD, stage[c])
            nxt[(c, "F")] += 1
            return step

        def bwd(c, split=False):
            i = nxt[(c, "B")]
            nxt[(c, "B")] += 1
            if split:
                weights.append(MetaStep(i, T.BWD_WEIGHT, stage[c]))
                return MetaStep(i, T.BWD_INPUT, stage[c])
            return MetaStep(i, T.BWD, stage[c])

        def unit(fc, bc):
            f, b = fwd(fc), bwd(bc)
            return [MetaStep.overlapped(f, b)] if overlap else [f, b]

        out += [fwd(0) for _ in range(2 * (p - 1 - r))]                        # 1
        for _ in range(r + 1):                                                 # 2
            out += [fwd(0), fwd(1)]
        for _ in range(p - 1 - r):                                             # 3
            out.append(bwd(1, split=True))
            out += [weights.popleft(), fwd(1)]
        for i in range(m - 2 * p + r + 1):                                     # 4
            if i == 0 and r == p - 1:
                out += [fwd(0), bwd(1)]
            else:
                out += unit(0, 1)
            out += unit(1, 0)
        for _ in range(p - 1 - r):                                             # 5
            out.append(bwd(1))
            out += unit(1, 0)
        split = False
        for i in range(r + 1):                                                 # 6
            if i == (r + 1) // 2 and r % 2 == 1:
                split = True
            out.append(bwd(1, split))
            if i == (r + 1) // 2 and r % 2 == 0:
                split = True
            out.append(bwd(0, split))
        for _ in range(p - 1 - r):                                             # 7
            out.append(weights.popleft())
            out.append(bwd(0, split=True))
        out += [weights.popleft() for _ in range(r + 1)]                       # 8
        assert not weights and all(n == m for n in nxt.values()), (r, nxt, weights)
        order[r] = out
    return order


# ---- DualPipe: the bidirectional original ---------------------------------------------------------------
# Source: DeepSeek-V3 Technical Report (arXiv:2412.19437), section 3.2.1, and the reference
# implementation deepseek-ai/DualPipe, dualpipe/dualpipe.py (DualPipe.step: steps 1-8, "nF0", "nF0F1",
# "nB1W1F1", "nF0B1F1B0", "nB1F1B0", "nB1B0", "nWB0", "nW"; half_rank = min(rank, p - 1 - rank);
# chunk 0 is the direction that enters at the nearer end of the pipeline).
#
# p ranks (even), a model of p stages, two copies of the weights: the "down" copy holds model stage r on
# rank r, the "up" copy model stage p-1-r on rank r. Microbatches 0..m/2-1 enter at rank 0 and flow down,
# microbatches m/2..m-1 enter at rank p-1 and flow up. Here as data: stage index k (0 <= k < p) is model
# stage k of the down copy, stage index p + k model stage k of the up copy; that is ZBV's V placement
# over 2p stage indices (index p + k on rank p-1-k), but a microbatch runs ONE copy (its route), not 2p
# stages. Rank r's steps are those of DualPipeV's rank half_rank with p/2 ranks and m/2 microbatches
# (chunk 0 = this rank's stage of the direction entering nearer, chunk 1 = the other): the reference
# implementation runs exactly the DualPipeV phases above, with ``half_num_ranks`` and ``half_num_chunks``.
# After a step the gradients of the two copies of a model stage (stage k on rank k, its copy on rank
# p-1-k) are summed so that both copies stay equal.

def dualpipe_routes(pp_size: int, micro_batch_num: int) -> Dict[int, range]:
    """Microbatch -> the stage indices it runs: the down copy ``0..p-1`` for the first half of the
    microbatches, the up copy ``p..2p-1`` for the second half."""
    half = micro_batch_num // 2
    return {i: range(0, pp_size) if i < half else range(pp_size, 2 * pp_size) for i in range(micro_batch_num)}


def dualpipe_model_stage(stage_index: int, pp_size: int):
    """``(copy, model stage)`` of a DualPipe stage index: ``("down", k)`` or ``("up", k)``."""
    return ("down", stage_index) if stage_index < pp_size else ("up", stage_index - pp_size)


def dualpipe_placement(pp_size: int):
    """Rank of each of the ``2p`` stage indices: down stage k on rank k, up stage k on rank p-1-k."""
    return tuple(range(pp_size)) + tuple(pp_size - 1 - k for k in range(pp_size))


def _dual_check(p, m) -> None:
    for name, value in (("pp_size", p), ("micro_batch_num", m)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ScheduleError("input", f"dualpipe_compute_order: {name}={value!r} must be a positive integer")
    if p % 2:
        raise ScheduleError("input", f"DualPipe: pp_size={p} must be even (each rank pairs with its mirror rank "
                            f"p-1-r; DeepSeek's DualPipe requires an even rank count); use {p + 1} ranks or "
                            "dualpipev")
    if m % 2 or m < 2 * p:
        raise ScheduleError("input", f"DualPipe: micro_batch_num={m} must be even (half enter at each end) and "
                            f">= 2 * pp_size = {2 * p} (each direction fills a pipeline of p ranks); use "
                            f"{max(2 * p, m + m % 2)}")


def dualpipe_compute_order(pp_size: int, micro_batch_num: int, overlap: bool = True) -> Dict[int, List[MetaStep]]:
    """DualPipe's compute order per rank (see above): stage indices ``0..2p-1`` (``dualpipe_placement``),
    microbatches ``0..m/2-1`` down, ``m/2..m-1`` up. ``overlap=False`` runs every ``FWD_BWD`` unit as
    its forward, then its backward."""
    p, m = pp_size, micro_batch_num
    _dual_check(p, m)
    half = m // 2
    v_order = dualpipev_compute_order(p // 2, half, overlap)
    order: Dict[int, List[MetaStep]] = {}
    for r in range(p):
        h = min(r, p - 1 - r)

        def dual(step: MetaStep) -> MetaStep:
            if step.type is T.FWD_BWD:
                return MetaStep.overlapped(*(dual(part) for part in step.parts))
            v = step.stage_index                    # DualPipeV's stage h (chunk 0) or p-1-h (chunk 1)
            if v == r:                              # this rank's stage of the down copy
                return MetaStep(step.micro_index, step.type, r)
            assert v == p - 1 - r, (r, step)        # this rank's stage of the up copy
            return MetaStep(half + step.micro_index, step.type, p + (p - 1 - r))
        order[r] = [dual(step) for step in v_order[h]]
    return order


def dualpipe_consumes(pp_size: int, micro_batch_num: int):
    """``consumes(step) -> data`` of DualPipe's two routes (for ``compute_order.ideal_timeline``)."""
    routes = dualpipe_routes(pp_size, micro_batch_num)

    def consumes(step: MetaStep):
        out = []
        for part in step.parts:
            i, s, t = part.micro_index, part.stage_index, part.type
            first, last = s == routes[i][0], s == routes[i][-1]
            if t is T.FWD:
                out += [] if first else [("act", i, s - 1)]
            elif t in (T.BWD, T.BWD_INPUT):
                out += [("act", i, s)] + ([] if last else [("grad", i, s + 1)])
            elif t is T.BWD_WEIGHT:
                out.append(("grad", i, s))
        return tuple(out)
    return consumes


def validate_dualpipe_order(order: Dict[int, List[MetaStep]], pp_size: int, micro_batch_num: int,
                            costs=None):
    """Check a DualPipe compute order the way ``validate_compute_order`` checks a one-chain order, on
    DualPipe's two routes: every step on the rank of its stage (``dualpipe_placement``), a microbatch
    only on the stages of its route, no step twice, every (microbatch, stage of its route) with a
    forward and a full or split backward, within a rank a step after what the rank itself produces for
    it, and data flow (free communication: every rank finishes; else the waiting chain is named).
    Returns the ideal timeline (``{step: (start, end)}``) under ``costs`` (a ``StepCosts``)."""
    from .compute_order import ideal_timeline
    from .costs import StepCosts
    p, m = pp_size, micro_batch_num
    _dual_check(p, m)
    rank_of, routes = dualpipe_placement(p), dualpipe_routes(p, m)
    seen: Dict[MetaStep, tuple] = {}
    for rank, steps in order.items():
        for idx, step in enumerate(steps):
            if not isinstance(step, MetaStep) or not step.type.is_compute:
                raise ScheduleError("input", f"{step!r}: a DualPipe compute order holds FWD, BWD, BWD_INPUT, "
                                    "BWD_WEIGHT and FWD_BWD MetaSteps only", rank=rank, index=idx)
            for part in step.parts:
                i, s = part.micro_index, part.stage_index
                where = dict(rank=rank, index=idx, step=step)
                if not 0 <= i < m:
                    raise ScheduleError("placement", f"{part!r}: microbatch {i} does not exist (micro_batch_num="
                                        f"{m})", **where)
                if s not in routes[i]:
                    raise ScheduleError("placement", f"{part!r}: microbatch {i} runs the "
                                        f"{dualpipe_model_stage(routes[i][0], p)[0]} copy, stages "
                                        f"{routes[i][0]}..{routes[i][-1]}, not stage {s}", **where)
                if rank_of[s] != rank:
                    raise ScheduleError("placement", f"{part!r}: stage {s} ({'/'.join(map(str, dualpipe_model_stage(s, p)))}) "
                                        f"lives on rank {rank_of[s]}, not on rank {rank}", **where)
                if part in seen:
                    raise ScheduleError("unique", f"{part!r} appears twice (first at rank {seen[part][0]} step "
                                        f"{seen[part][1]})", **where)
                seen[part] = (rank, idx)
    for i, route in routes.items():
        for s in route:
            full = MetaStep(i, T.BWD, s) in seen
            split = [MetaStep(i, t, s) in seen for t in (T.BWD_INPUT, T.BWD_WEIGHT)]
            if MetaStep(i, T.FWD, s) not in seen or not (full ^ all(split)) or (full and any(split)) \
                    or (any(split) and not all(split)):
                raise ScheduleError("complete", f"microbatch {i}, stage {s} on rank {rank_of[s]}: needs one FWD and "
                                    "either one BWD or one BWD_INPUT and one BWD_WEIGHT")
    consumes = dualpipe_consumes(p, m)
    produced_by = {}
    for part in seen:
        if part.type is T.FWD:
            produced_by[("act", part.micro_index, part.stage_index)] = part
        elif part.type in (T.BWD, T.BWD_INPUT):
            produced_by[("grad", part.micro_index, part.stage_index)] = part
    for rank, steps in order.items():
        for idx, step in enumerate(steps):
            for part in step.parts:
                for need in consumes(part):
                    producer = produced_by[need]
                    pr, pi = seen[producer]
                    if pr == rank and pi >= idx:
                        raise ScheduleError("order", f"{part!r} needs {producer!r}, which comes "
                                            f"{'in the same unit' if pi == idx else f'later (step {pi})'} on rank "
                                            f"{rank}", rank=rank, index=idx, step=step)
    return ideal_timeline(order, 2 * p, costs if costs is not None else StepCosts(), consumes=consumes)


def simulate_dualpipe(pp_size: int, micro_batch_num: int, fwd_time: float = 2.0, bwd_time: float = 4.0,
                      overlap: float = 0.0, order: Optional[Dict[int, List[MetaStep]]] = None):
    """DualPipe's predicted step with free communication (the ideal timeline: what posted point-to-point
    with hidden transfers reaches), as the ``simulator.Timeline`` that ``render_text``, ``render_svg`` and
    ``to_chrome_trace`` draw: makespan, bubble ratio (idle over makespan x ranks), bubble per rank, peak
    in-flight activations per rank and per stage (a unit = one stage of one microbatch) and until the
    weight gradient. ``fwd_time``/``bwd_time`` per stage of one microbatch (I = W = B/2); ``overlap``
    credits ``FWD_BWD`` units as ``StepCosts``."""
    from .costs import StepCosts
    from .replay import StepTiming
    from .simulator import Timeline, in_flight_peaks
    order = order if order is not None else dualpipe_compute_order(pp_size, micro_batch_num, overlap=True)
    costs = StepCosts(fwd_time, bwd_time, overlap=overlap)
    timing = validate_dualpipe_order(order, pp_size, micro_batch_num, costs)
    steps = {r: [StepTiming(st, *timing[st]) for st in order[r]] for r in sorted(order)}
    makespan = max(end for _, end in timing.values())
    busy = {r: sum(t.end - t.start for t in ts) for r, ts in steps.items()}
    per_rank, per_stage, until_w = in_flight_peaks(steps)
    return Timeline(steps, makespan, 1 - sum(busy.values()) / (makespan * len(steps)),
                    {r: 1 - b / makespan for r, b in busy.items()}, per_rank, per_stage, until_w)
