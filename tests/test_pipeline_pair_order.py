"""The posted model's per-pair order rule (``pair_order`` in the validator): a rank posts its
receives from a peer in the order that peer posts its sends to it. Transports that match
point-to-point messages in post order per pair (NCCL and HCCL ignore tags) would otherwise hand
a receive another message of the same shape, silently.

PyTorch 2.13's orders come from tests/data/torch_pipeline_orders.json, made once by
scripts/make_torch_pipeline_orders.py (torch's own lowering of its schedules; no torch here).
Pure logic, no process group."""
import json
import re
from pathlib import Path

import pytest

from mindformers_core.common.placement import stage_placement
from mindformers_core.pipeline import (
    BUILTIN_SCHEDULES, MetaStep, MetaStepType as T, PipelineScheduleMulti, ScheduleError, add_communication,
    build_schedule, compute_only, dualpipev_compute_order, ideal_makespan, simulate, stages_of_rank,
    validate_schedule)

DATA = json.loads((Path(__file__).parent / "data" / "torch_pipeline_orders.json").read_text())
TYPES = {"F": T.FWD, "B": T.BWD, "I": T.BWD_INPUT, "W": T.BWD_WEIGHT, "SEND_F": T.FWD_SEND,
         "RECV_F": T.FWD_RECV, "SEND_B": T.BWD_SEND, "RECV_B": T.BWD_RECV}
ACTION = re.compile(r"(\d+)(SEND_F|RECV_F|SEND_B|RECV_B|F|B|I|W)(\d+)$")


def _single(text):
    stage, kind, micro = ACTION.match(text).groups()
    return MetaStep(int(micro), TYPES[kind], int(stage))


def _action(text):
    """torch's printed action: "0F6", "7RECV_B0", "(0F3;3B1)OVERLAP_F_B"."""
    if text.endswith("OVERLAP_F_B"):
        forward, backward = text[1:text.index(")")].split(";")
        return MetaStep.overlapped(_single(forward), _single(backward))
    return _single(text)


def torch_order(case):
    """A torch order in our vocabulary, with torch's runtime semantics: each receive is posted
    where it stands and waited on by the step that uses its data (a wait step right before it);
    data between stages of one rank moves by a handoff right after its producer (torch moves it
    without an action)."""
    placement = case["placement"]
    n = len(placement)
    out = {}
    for rank, text in case["order"].items():
        steps = [_action(a) for a in text.split()]
        unwaited = {s for s in steps if s.type.is_recv}
        order = []
        for step in steps:
            for part in step.parts if step.type.is_compute else ():
                recv = (MetaStep(part.micro_index, T.FWD_RECV, part.stage_index) if part.type is T.FWD else
                        MetaStep(part.micro_index, T.BWD_RECV, part.stage_index)
                        if part.type in (T.BWD, T.BWD_INPUT) else None)
                if recv in unwaited:
                    order.append(recv.wait())
                    unwaited.discard(recv)
            order.append(step)
            for part in step.parts if step.type.is_compute else ():
                s, m = part.stage_index, part.micro_index
                if part.type is T.FWD and s + 1 < n and placement[s + 1] == placement[s]:
                    order.append(MetaStep(m, T.FWD_HANDOFF, s))
                if part.type in (T.BWD, T.BWD_INPUT) and s > 0 and placement[s - 1] == placement[s]:
                    order.append(MetaStep(m, T.BWD_HANDOFF, s))
        out[int(rank)] = order
    return out, placement, n, case["microbatches"]


def case_id(case):
    return f"{case['schedule']}-p{case['pp']}-m{case['microbatches']}-" + ("deferred" if case["defer_pp_recv"] else "asap")


# measured with PyTorch 2.13 (issue 31): these deferred-receive orders post a receive ahead of
# the one the sender sent first; (schedule, pp, microbatches) -> (receiving rank, its step, the
# receive, the sender's step, the send it would get)
OUT_OF_ORDER = {
    ("ScheduleInterleavedZeroBubble", 2, 4): (1, "RECV_F2@s1", "SEND_B0@s2"),
    ("ScheduleZBVZeroBubble", 2, 4): (1, "RECV_B0@s2", "SEND_F2@s0"),
    ("ScheduleZBVZeroBubble", 4, 8): (1, "RECV_B0@s6", "SEND_F6@s0"),
    ("ScheduleDualPipeV", 4, 8): (1, "RECV_B0@s6", "SEND_F6@s0"),
}


def test_the_data_is_torch_2_13s_orders():
    assert DATA["torch"].startswith("2.13")
    assert len(DATA["cases"]) == 20
    assert {c["schedule"] for c in DATA["cases"]} == {
        "ScheduleLoopedBFS", "ScheduleInterleaved1F1B", "ScheduleInterleavedZeroBubble",
        "ScheduleZBVZeroBubble", "ScheduleDualPipeV"}


@pytest.mark.parametrize("case", DATA["cases"], ids=case_id)
def test_torch_orders_against_the_pair_order_rule(case):
    order, placement, n, m = torch_order(case)
    key = (case["schedule"], case["pp"], case["microbatches"])
    bad = OUT_OF_ORDER.get(key) if case["defer_pp_recv"] else None
    if bad is None:
        validate_schedule(order, n, m, placement, blocking_send=False)
        assert simulate(order, blocking_send=False).makespan == ideal_makespan(compute_only(order), n)
        return
    rank, recv, send = bad
    with pytest.raises(ScheduleError) as err:
        validate_schedule(order, n, m, placement, blocking_send=False)
    e = err.value
    assert e.rule == "pair_order" and e.rank == rank and repr(e.step) == recv
    assert order[rank][e.index] == e.step
    sender = placement[e.step.peer().stage_index]
    assert f"rank {rank} posts its receives from rank {sender} in another order than rank {sender}" in str(e)
    assert f"is {send} (its step {order[sender].index(_parse_repr(send))})" in str(e)
    assert f"{recv[:4]}" in str(e) and "NCCL/HCCL ignore tags" in str(e)
    # the sender really posts the other send first, the receiver really posts this receive first
    mine, other = e.step.peer(), _parse_repr(send)
    assert order[sender].index(other) < order[sender].index(mine)
    assert order[rank].index(e.step) < order[rank].index(other.peer())
    # the same compute order with receives posted in the senders' order is valid and ideal
    compute = compute_only(order)
    posted = add_communication(compute, placement, n, blocking_send=False)
    validate_schedule(posted, n, m, placement, blocking_send=False)
    assert simulate(posted, blocking_send=False).makespan == ideal_makespan(compute, n)


def _parse_repr(text):
    """Our repr ("SEND_F6@s0") back to a MetaStep."""
    kind, rest = re.match(r"([A-Z_]+?)(\d+@s\d+)$", text).groups()
    micro, stage = rest.split("@s")
    return MetaStep(int(micro), next(t for t in T if t.value == kind), int(stage))


def test_torch_dualpipev_compute_order_is_ours():
    case = next(c for c in DATA["cases"] if c["schedule"] == "ScheduleDualPipeV" and c["pp"] == 4
                and not c["defer_pp_recv"])
    order, *_ = torch_order(case)
    assert compute_only(order) == dualpipev_compute_order(4, case["microbatches"])


@pytest.mark.parametrize("name", sorted(BUILTIN_SCHEDULES))
@pytest.mark.parametrize("p, m", [(2, 4), (4, 8)])
def test_our_schedules_keep_the_pair_order(name, p, m):
    """Every built-in schedule's order, and its compute order with posted communication."""
    cls, per_rank, placement = BUILTIN_SCHEDULES[name]
    sched = build_schedule(name, stages_of_rank(0, p, per_rank, placement), m)
    n, pl, routes = sched.stage_num, sched.placement, sched.routes
    validate_schedule(sched.exec_order, n, m, pl, blocking_send=False, routes=routes)
    posted = add_communication(compute_only(sched.exec_order), pl, n, blocking_send=False,
                               micro_batch_num=m, routes=routes)
    validate_schedule(posted, n, m, pl, blocking_send=False, routes=routes)


def test_smallest_swap_is_named():
    """Rank 0 sends microbatch 0 then 1; rank 1 posts the receive of 1 first."""
    S = MetaStep
    F, B = (lambda m, s: S(m, T.FWD, s)), (lambda m, s: S(m, T.BWD, s))
    order = {0: [F(0, 0), S(0, T.FWD_SEND, 0), F(1, 0), S(1, T.FWD_SEND, 0),
                 S(0, T.BWD_RECV, 0), S(1, T.BWD_RECV, 0), S(0, T.BWD_WAIT, 0), B(0, 0), S(1, T.BWD_WAIT, 0), B(1, 0)],
             1: [S(1, T.FWD_RECV, 1), S(0, T.FWD_RECV, 1), S(0, T.FWD_WAIT, 1), F(0, 1), B(0, 1), S(0, T.BWD_SEND, 1),
                 S(1, T.FWD_WAIT, 1), F(1, 1), B(1, 1), S(1, T.BWD_SEND, 1)]}
    with pytest.raises(ScheduleError, match=r"^rank 1, step 0, RECV_F1@s1: rank 1 posts its receives from rank 0 "
                                            r"in another order than rank 0 posts its sends to rank 1: this is its "
                                            r"receive #0 from rank 0, but rank 0's send #0 to rank 1 is SEND_F0@s0 "
                                            r"\(its step 1\); SEND_F1@s0 comes at its step 3\. .* \[rule: pair_order\]$"):
        validate_schedule(order, 2, 2, blocking_send=False)
    # posted in the sender's order it is valid
    order[1][0], order[1][1] = order[1][1], order[1][0]
    validate_schedule(order, 2, 2, blocking_send=False)


def test_a_posted_schedule_breaking_the_rule_is_refused_before_it_can_run():
    """A schedule class with a posted order is validated when it is constructed, before the
    runtime exists: torch's deferred ZBV order (p=4, m=8) is refused there."""
    case = next(c for c in DATA["cases"] if c["schedule"] == "ScheduleZBVZeroBubble" and c["pp"] == 4
                and c["defer_pp_recv"])
    order, placement, n, m = torch_order(case)

    class TorchDeferredZBV(PipelineScheduleMulti):
        blocking_send = False

        def construct_exec_order(self):
            self.exec_order = {r: list(steps) for r, steps in order.items()}

    assert tuple(placement) == stage_placement("v", 4, 2)
    with pytest.raises(ScheduleError, match=r"RECV_B0@s6: rank 1 posts its receives from rank 0 in another "
                                            r"order.*\[rule: pair_order\]"):
        TorchDeferredZBV(stages_of_rank(0, 4, 2, "v"), m, placement="v")
