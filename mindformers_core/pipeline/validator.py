"""Check an exec order before anything runs; a broken schedule fails here, naming rank and step.

Rules, in the order they are checked (the ``rule`` of the raised ScheduleError):

* ``input``     the arguments themselves (sizes, placement, step objects);
* ``placement`` every step runs on the rank that holds its stage; stages exist; microbatches exist;
* ``unique``    no step appears twice;
* ``neighbour`` sends/receives/waits connect stages on different ranks, handoffs stages on one rank;
* ``matching``  every send has its receive on the neighbour's rank and vice versa; a wait step has
  its receive on the same rank;
* ``complete``  every (microbatch, stage) has one FWD and one BWD, or one BWD_INPUT and one
  BWD_WEIGHT; every stage boundary of every microbatch has its transfer;
* ``order``     within a rank, a step comes after what it needs: a forward after its input arrived
  (after the wait step when its receive has one), a send after the step producing the data, a
  backward after its forward and after its output gradient arrived, a weight gradient after the
  input gradient, a wait after its receive. The two halves of a FWD_BWD unit must each find what
  they need before the unit. Across ranks these chains plus the transfers give: FWD of stage s
  after FWD of s-1, BWD of s after BWD of s+1;
* ``dataflow``  the compute steps alone can finish with free communication (else the chain of
  ranks waiting for each other's data is named, see ``compute_order``);
* ``pair_order`` (posted model) between any two ranks, the receiver posts its receives from the
  sender in the order the sender posts its sends to it. Transports that match point-to-point
  messages in post order per pair (NCCL and HCCL ignore tags) would otherwise hand a receive
  another message of the same shape, silently. Under blocking rendezvous such an order is a
  ``deadlock`` already (each send waits for its own receive);
* ``deadlock``  replaying the sends/receives (see ``replay``: blocking rendezvous by default,
  posted sends and receives with ``blocking_send=False``), every rank finishes.
"""
from __future__ import annotations

from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from .compute_order import compute_only, ideal_timeline
from .errors import ScheduleError
from .meta_step import MetaStep, MetaStepType as T, Routes, route_of
from .replay import replay
from ..common.placement import PlacementSpec, stage_placement


def _positive(name: str, value) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ScheduleError("input", f"{name}={value!r} must be a positive integer")


def _resolve_placement(placement: Optional[PlacementSpec], ranks: Sequence[int],
                       stage_num: int) -> Tuple[int, ...]:
    if placement is None:                                   # one stage per rank: stage s on rank s
        return tuple(range(stage_num))
    if isinstance(placement, str):
        pp = len(ranks)
        if pp == 0 or stage_num % pp:
            raise ScheduleError("input", f"placement={placement!r} needs stage_num={stage_num} to be a "
                                f"multiple of the number of ranks in exec_order ({pp})")
        try:
            return stage_placement(placement, pp, stage_num // pp)
        except ValueError as e:
            raise ScheduleError("input", str(e)) from None
    ranks_of = tuple(placement)
    if len(ranks_of) != stage_num:
        raise ScheduleError("input", f"placement={list(ranks_of)} gives {len(ranks_of)} ranks; it needs "
                            f"one rank per stage (stage_num={stage_num})")
    return ranks_of


def _expected_transfers(m: int, s: int, stage_num: int, rank_of: Sequence[int],
                        routes: Routes = None) -> List[MetaStep]:
    """The steps that move microbatch m's data out of stage s (forward and backward)."""
    out = []
    route = route_of(m, stage_num, routes)
    for nxt, send, recv, hand in ((s + 1, T.FWD_SEND, T.FWD_RECV, T.FWD_HANDOFF),
                                  (s - 1, T.BWD_SEND, T.BWD_RECV, T.BWD_HANDOFF)):
        if nxt in route:
            if rank_of[nxt] == rank_of[s]:
                out.append(MetaStep(m, hand, s))
            else:
                out += [MetaStep(m, send, s), MetaStep(m, recv, nxt)]
    return out


def _requirements(step: MetaStep, stage_num: int, rank_of: Sequence[int],
                  present: Dict[MetaStep, Tuple[int, int]], routes: Routes = None) -> List[Tuple[MetaStep, str]]:
    """What must come earlier on the same rank, with the reason (for the error message). For a
    FWD_BWD unit: what either half needs."""
    if step.type is T.FWD_BWD:
        return [need for part in step.parts for need in _requirements(part, stage_num, rank_of, present, routes)]
    m, s, t = step.micro_index, step.stage_index, step.type
    route = route_of(m, stage_num, routes)
    first, last = (route[0], route[-1]) if len(route) else (0, stage_num - 1)
    local_prev = s > first and rank_of[s - 1] == rank_of[s]
    local_next = s < last and rank_of[s + 1] == rank_of[s]
    backward = MetaStep(m, T.BWD, s) if MetaStep(m, T.BWD, s) in present else MetaStep(m, T.BWD_INPUT, s)

    def arrived(recv: MetaStep) -> MetaStep:          # the data is usable after the wait, if any
        return recv.wait() if recv.wait() in present else recv

    if t is T.FWD:
        if s <= first:
            return []
        src = MetaStep(m, T.FWD_HANDOFF, s - 1) if local_prev else arrived(MetaStep(m, T.FWD_RECV, s))
        return [(src, "a forward needs its input from the previous stage first")]
    if t in (T.FWD_SEND, T.FWD_HANDOFF):
        return [(MetaStep(m, T.FWD, s), "an activation is passed on only after its forward")]
    if t in (T.BWD, T.BWD_INPUT):
        needs = [(MetaStep(m, T.FWD, s), "a backward comes after its forward")]
        if s < last:
            src = MetaStep(m, T.BWD_HANDOFF, s + 1) if local_next else arrived(MetaStep(m, T.BWD_RECV, s))
            needs.append((src, "a backward needs the output gradient from the next stage first"))
        return needs
    if t is T.BWD_WEIGHT:
        return [(MetaStep(m, T.BWD_INPUT, s), "BWD_WEIGHT comes after BWD_INPUT")]
    if t in (T.BWD_SEND, T.BWD_HANDOFF):
        return [(backward, "a gradient is passed on only after the backward producing it")]
    if t.is_wait:
        return [(step.recv(), "a wait comes after the receive it completes")]
    return []


def validate_schedule(exec_order: Mapping[int, Sequence[MetaStep]], stage_num: int,
                      micro_batch_num: int, placement: Optional[PlacementSpec] = None,
                      blocking_send: bool = True, routes: Routes = None) -> None:
    """Raise ScheduleError (DeadlockError for a deadlock) if ``exec_order`` cannot run correctly.

    ``placement`` gives the rank of each stage: None for one stage per rank (stage s on rank s),
    ``"interleaved"``/``"v"`` (with ``len(exec_order)`` ranks), or an explicit sequence.
    ``blocking_send``: the point-to-point model the deadlock check replays (``meta_step``
    explains both): True for blocking rendezvous (the CPU runtime), False for posted sends and
    receives completed by wait steps. An order valid with True is valid with False.
    ``routes`` (microbatch -> the contiguous range of stages it runs, ``meta_step.Routes``; default
    every stage): a microbatch runs only its route, enters at the route's first stage and ends
    at its last, and no data crosses out of a route (DualPipe's two directions).
    """
    if not isinstance(exec_order, Mapping):
        raise ScheduleError("input", f"exec_order must be a dict rank -> list of MetaStep, "
                            f"got {type(exec_order).__name__}")
    _positive("stage_num", stage_num)
    _positive("micro_batch_num", micro_batch_num)
    if not isinstance(blocking_send, bool):
        raise ScheduleError("input", f"blocking_send={blocking_send!r} must be True (blocking rendezvous) or "
                            "False (posted sends/receives)")
    rank_of = _resolve_placement(placement, list(exec_order), stage_num)
    for s, r in enumerate(rank_of):
        if r not in exec_order:
            raise ScheduleError("input", f"stage {s} lives on rank {r} (placement), but exec_order has "
                                f"no list for rank {r}; it has ranks {sorted(exec_order)}")

    present: Dict[MetaStep, Tuple[int, int]] = {}     # every single step (halves of a unit too)
    for rank, steps in exec_order.items():
        for i, step in enumerate(steps):
            if not isinstance(step, MetaStep):
                raise ScheduleError("input", f"{step!r} is a {type(step).__name__}, not a MetaStep",
                                    rank=rank, index=i)
            where = dict(rank=rank, index=i, step=step)
            for part in step.parts:
                what = f"{part!r} of the unit: " if step.type is T.FWD_BWD else ""
                if part.stage_index >= stage_num:
                    raise ScheduleError("placement", f"{what}stage {part.stage_index} does not exist "
                                        f"(stage_num={stage_num})", **where)
                if part.micro_index >= micro_batch_num:
                    raise ScheduleError("placement", f"{what}microbatch {part.micro_index} does not exist "
                                        f"(micro_batch_num={micro_batch_num})", **where)
                if rank_of[part.stage_index] != rank:
                    raise ScheduleError("placement", f"{what}stage {part.stage_index} lives on rank "
                                        f"{rank_of[part.stage_index]}, not on rank {rank}", **where)
                route = route_of(part.micro_index, stage_num, routes)
                if part.stage_index not in route:
                    raise ScheduleError("placement", f"{what}microbatch {part.micro_index} runs the route of "
                                        f"stages {route[0]}..{route[-1]}, not stage {part.stage_index}"
                                        if len(route) else f"{what}microbatch {part.micro_index} has no route",
                                        **where)
                if part in present:
                    raise ScheduleError("unique", f"{what}appears twice (first at rank {present[part][0]} step "
                                        f"{present[part][1]})", **where)
                present[part] = (rank, i)
            nxt = step.neighbour_stage
            if nxt is not None:
                if not 0 <= nxt < stage_num:
                    raise ScheduleError("neighbour", f"{step.type.name} talks to stage {nxt}, which does "
                                        f"not exist (stages 0..{stage_num - 1})", **where)
                if routes is not None and nxt not in route_of(step.micro_index, stage_num, routes):
                    raise ScheduleError("neighbour", f"{step.type.name} talks to stage {nxt}, which is not on "
                                        f"microbatch {step.micro_index}'s route (no data crosses between "
                                        "routes)", **where)
                same = rank_of[nxt] == rank
                if step.type.is_handoff and not same:
                    raise ScheduleError("neighbour", f"stage {nxt} is on rank {rank_of[nxt]}: a "
                                        f"handoff only joins stages of one rank; use send/recv", **where)
                if (step.type.is_p2p or step.type.is_wait) and same:
                    raise ScheduleError("neighbour", f"stage {nxt} is on the same rank: use "
                                        f"{'FWD' if step.type.name.startswith('FWD') else 'BWD'}_HANDOFF, "
                                        "not a send/recv to itself", **where)

    for step, (rank, i) in present.items():
        if step.type.is_wait and step.recv() not in present:
            raise ScheduleError("matching", f"no {step.recv()!r} on rank {rank} for this wait to complete",
                                rank=rank, index=i, step=step)
    for step, (rank, i) in present.items():
        if step.type.is_p2p and step.peer() not in present:
            raise ScheduleError("matching", f"no matching {step.peer()!r} on rank "
                                f"{rank_of[step.peer().stage_index]}", rank=rank, index=i, step=step)

    for m in range(micro_batch_num):
        for s in route_of(m, stage_num, routes):
            rank = rank_of[s]
            full, split = MetaStep(m, T.BWD, s), (MetaStep(m, T.BWD_INPUT, s), MetaStep(m, T.BWD_WEIGHT, s))
            if full in present and any(x in present for x in split):
                other = next(x for x in split if x in present)
                raise ScheduleError("complete", f"microbatch {m} of stage {s} has both a full backward "
                                    f"and a split one ({other!r}); use one or the other",
                                    rank=rank, index=present[full][1], step=exec_order[rank][present[full][1]])
            backward = [full] if full in present or not any(x in present for x in split) else list(split)
            for need in [MetaStep(m, T.FWD, s)] + backward + _expected_transfers(m, s, stage_num, rank_of, routes):
                if need not in present:
                    raise ScheduleError("complete", f"missing {need!r} on rank {rank_of[need.stage_index]}"
                                        f" (microbatch {m}, stage {s})")

    for rank, steps in exec_order.items():
        seen = set()
        for i, step in enumerate(steps):
            for need, why in _requirements(step, stage_num, rank_of, present, routes):
                if need not in seen:
                    inside = step.type is T.FWD_BWD and need in step.parts
                    raise ScheduleError("order", f"needs {need!r} earlier on rank {rank}: {why}"
                                        + (" (the halves of a FWD_BWD unit run together, so they must be "
                                           "independent)" if inside else ""),
                                        rank=rank, index=i, step=step)
            seen.update(step.parts)

    ideal_timeline(compute_only(exec_order), stage_num, routes=routes)
    if not blocking_send:
        _check_pair_order(exec_order, rank_of)
    replay(exec_order, duration=lambda step: 1.0, blocking=blocking_send)


def _check_pair_order(exec_order: Mapping[int, Sequence[MetaStep]], rank_of: Sequence[int]) -> None:
    """Rule ``pair_order``: for every (sender, receiver) pair of ranks, the k-th receive the
    receiver posts from the sender is the peer of the k-th send the sender posts to it.
    Raises naming the pair, the receiving rank and both steps (with their positions)."""
    sends: Dict[Tuple[int, int], List[Tuple[int, MetaStep]]] = {}
    recvs: Dict[Tuple[int, int], List[Tuple[int, MetaStep]]] = {}
    for rank, steps in exec_order.items():
        for i, step in enumerate(steps):
            if step.type.is_send:
                sends.setdefault((rank, rank_of[step.neighbour_stage]), []).append((i, step))
            elif step.type.is_recv:
                recvs.setdefault((rank_of[step.neighbour_stage], rank), []).append((i, step))
    for (src, dst), posted in sorted(recvs.items()):
        sent = sends.get((src, dst), [])
        where = {step: i for i, step in sent}
        for k, (j, recv) in enumerate(posted):
            if k >= len(sent) or recv.peer() == sent[k][1]:
                continue
            i, other = sent[k]
            own = where.get(recv.peer())
            raise ScheduleError(
                "pair_order",
                f"rank {dst} posts its receives from rank {src} in another order than rank {src} posts "
                f"its sends to rank {dst}: this is its receive #{k} from rank {src}, but rank {src}'s send "
                f"#{k} to rank {dst} is {other!r} (its step {i})"
                + (f"; {recv.peer()!r} comes at its step {own}" if own is not None else "")
                + f". Transports matching messages in post order per pair (NCCL/HCCL ignore tags) would "
                f"hand {recv!r} the data of {other!r}; post the receives in the sender's order",
                rank=dst, index=j, step=recv)


def describe_exec_order(exec_order: Mapping[int, Sequence[MetaStep]]) -> Tuple[int, int, Tuple[int, ...]]:
    """(stage_num, micro_batch_num, placement) read off an exec order, for checking an order that
    came without its schedule. A stage is placed on the rank where its steps appear."""
    rank_of: Dict[int, int] = {}
    micro = 0
    for rank, steps in exec_order.items():
        for step in steps:
            for part in step.parts:
                rank_of.setdefault(part.stage_index, rank)
                micro = max(micro, part.micro_index + 1)
    if not rank_of:
        raise ScheduleError("input", "exec_order has no steps")
    stage_num = max(rank_of) + 1
    missing = [s for s in range(stage_num) if s not in rank_of]
    if missing:
        raise ScheduleError("complete", f"stages {missing} have no steps on any rank")
    return stage_num, micro, tuple(rank_of[s] for s in range(stage_num))
