"""Posted (non-blocking) point-to-point in the schedule model, and compute orders checked before
communication is added. Pure logic, no process group. The compute orders are built here (or by
our schedules); the sizes and makespans are the cases measured in issue 20."""
import pytest

from mindformers_core.common.placement import stage_placement
from mindformers_core.pipeline import (
    DeadlockError, MetaStep, MetaStepType as T, ScheduleError, ScheduleInterleaved1F1B, ScheduleZeroBubbleV,
    StepCosts, add_communication, compute_only, dualpipev_compute_order, ideal_makespan, lower_for_runtime,
    simulate, stages_of_rank, validate_compute_order, validate_schedule)
from mindformers_core.pipeline.meta_step import produces_all
from mindformers_core.pipeline.zero_bubble import greedy_split_backward_order


def F(m, s): return MetaStep(m, T.FWD, s)                      # noqa: E704
def B(m, s): return MetaStep(m, T.BWD, s)                      # noqa: E704
def I(m, s): return MetaStep(m, T.BWD_INPUT, s)                # noqa: E704,E743
def W(m, s): return MetaStep(m, T.BWD_WEIGHT, s)               # noqa: E704


def deferred(compute, placement):
    """Each send right after its producer, each receive right before its consumer (no wait
    steps: the receive completes where it stands, i.e. its consumer waits for it, the shape of
    PyTorch's deferred receives without its rank-parity flushes)."""
    n = len(placement)
    container = {part: s for steps in compute.values() for s in steps for part in s.parts}
    recvs, out = {}, {}
    for steps in compute.values():
        for step in steps:
            for kind, m, s in produces_all(step):
                nxt = s + 1 if kind == "act" else s - 1
                if 0 <= nxt < n and placement[nxt] != placement[s]:
                    wanted = [F(m, nxt)] if kind == "act" else [B(m, nxt), I(m, nxt)]
                    consumer = next(container[c] for c in wanted if c in container)
                    send = MetaStep(m, T.FWD_SEND if kind == "act" else T.BWD_SEND, s)
                    recvs.setdefault(consumer, []).append(send.peer())
    for rank, steps in compute.items():
        order = []
        for step in steps:
            order += recvs.get(step, []) + [step]
            for kind, m, s in produces_all(step):
                nxt = s + 1 if kind == "act" else s - 1
                if 0 <= nxt < n:
                    local = placement[nxt] == placement[s]
                    typ = {("act", True): T.FWD_HANDOFF, ("act", False): T.FWD_SEND,
                           ("grad", True): T.BWD_HANDOFF, ("grad", False): T.BWD_SEND}[kind, local]
                    order.append(MetaStep(m, typ, s))
        out[rank] = order
    return out


P, M = 4, 8
LOOP, VEE = stage_placement("interleaved", P, 2), stage_placement("v", P, 2)


def looped_bfs(p, m):
    """Every microbatch through a rank's first stage, then through its second; backwards mirrored."""
    return {r: [F(i, c * p + r) for c in range(2) for i in range(m)]
            + [B(i, c * p + r) for c in (1, 0) for i in range(m)] for r in range(p)}


DEFERRED_CASES = {
    "interleaved_1f1b": lambda: (ScheduleInterleaved1F1B(stages_of_rank(0, P, 2), M).compute_order(), LOOP, M),
    "looped_bfs": lambda: (looped_bfs(P, M), LOOP, M),
    "interleaved_zero_bubble": lambda: (greedy_split_backward_order(LOOP, M, admit_limit=[2 * P] * P), LOOP, M),
    "zbv": lambda: (compute_only(ScheduleZeroBubbleV(stages_of_rank(0, P, 2, "v"), M).exec_order), VEE, M),
    "dualpipev": lambda: (dualpipev_compute_order(P, 2 * M), VEE, 2 * M),
    "dualpipev_serialised": lambda: (dualpipev_compute_order(P, 2 * M, overlap=False), VEE, 2 * M),
}


# orders whose receives, placed right before their consumers, break the per-pair post order
# (validator rule pair_order, issue 31)
POSTED_OUT_OF_PAIR_ORDER = {"dualpipev", "dualpipev_serialised"}


@pytest.mark.parametrize("name", DEFERRED_CASES)
def test_deferred_receive_orders_deadlock_blocking_but_reach_the_ideal_posted(name):
    """Issue 20: with receives deferred to their consumer, these orders are deadlocks under
    blocking send/recv, and finish at the compute order's ideal makespan when a send only posts
    (those keeping the per-pair post order; add_communication's posted placement always does)."""
    compute, placement, m = DEFERRED_CASES[name]()
    n = len(placement)
    order = deferred(compute, placement)
    with pytest.raises(DeadlockError) as err:
        validate_schedule(order, n, m, placement)
    assert err.value.blocking and "blocking send/recv never meet" in str(err.value)
    if name in POSTED_OUT_OF_PAIR_ORDER:
        # receives right before their consumers post, on rank 1, the gradient of microbatch 0 ahead
        # of forwards rank 0 sent first: a transport matching per pair in post order would swap them
        with pytest.raises(ScheduleError, match=r"rank 1 posts its receives from rank 0 in another order"):
            validate_schedule(order, n, m, placement, blocking_send=False)
    else:
        validate_schedule(order, n, m, placement, blocking_send=False)
        assert simulate(order, blocking_send=False).makespan == ideal_makespan(compute, n)
    # add_communication's posted orders reach it too, and lower to a valid blocking order
    posted = add_communication(compute, placement, n, blocking_send=False)
    assert simulate(posted, blocking_send=False).makespan == ideal_makespan(compute, n)
    lowered = lower_for_runtime(posted, n, m, placement)
    validate_schedule(lowered, n, m, placement)
    assert not any(s.type.is_wait or s.type is T.FWD_BWD for steps in lowered.values() for s in steps)


@pytest.mark.parametrize("compute, placement, ideal, blocking", [
    # PyTorch's Megatron-style interleaved order at p=2, m=4 (no stagger of the warm-up)
    (lambda: ScheduleInterleaved1F1B(stages_of_rank(0, 2, 2), 4).compute_order(),
     stage_placement("interleaved", 2, 2), 27, 29),
    # DualPipeV with every overlapped unit serialised (forward, then backward), p=4, m=16
    (lambda: dualpipev_compute_order(4, 16, overlap=False), stage_placement("v", 4, 2), 99, 120),
])
def test_add_communication_posted_reaches_what_blocking_loses(compute, placement, ideal, blocking):
    compute = compute()
    n = len(placement)
    assert ideal_makespan(compute, n) == ideal
    assert simulate(add_communication(compute, placement, n)).makespan == blocking
    posted = add_communication(compute, placement, n, blocking_send=False)
    tl = simulate(posted, blocking_send=False)
    assert tl.makespan == ideal
    assert [s for s in posted[0] if s.type.is_compute] == compute[0]      # the compute order is kept
    # every receive has its wait, and the wait comes right before the step using the data
    for rank, steps in posted.items():
        for i, step in enumerate(steps):
            if step.type.is_recv:
                j = steps.index(step.wait())
                assert j > i
                assert steps[j + 1].type.is_compute or steps[j + 1].type.is_wait


def test_posted_orders_hide_transfers_behind_compute():
    compute = ScheduleInterleaved1F1B(stages_of_rank(0, 4, 2), 8).compute_order()
    posted = add_communication(compute, LOOP, 8, blocking_send=False)
    blocking = add_communication(compute, LOOP, 8)
    free = simulate(posted, blocking_send=False).makespan
    assert simulate(posted, blocking_send=False, comm_time=0.5).makespan < simulate(blocking, comm_time=0.5).makespan
    assert simulate(posted, blocking_send=False, comm_time=0.5).makespan < free + 0.5 * 2 * 8


def test_posted_order_is_validated_and_its_deadlock_named():
    # rank 0 waits for a gradient before it posts the forward send rank 1 waits for
    S = MetaStep
    order = {0: [F(0, 0), S(0, T.BWD_RECV, 0), S(0, T.BWD_WAIT, 0), S(0, T.FWD_SEND, 0), B(0, 0)],
             1: [S(0, T.FWD_RECV, 1), S(0, T.FWD_WAIT, 1), F(0, 1), B(0, 1), S(0, T.BWD_SEND, 1)]}
    with pytest.raises(DeadlockError) as err:
        validate_schedule(order, 2, 1, blocking_send=False)
    assert "posted receives wait for sends that are never posted" in str(err.value)
    assert err.value.stuck[0] == (2, S(0, T.BWD_WAIT, 0), 1) and err.value.cycle == (0, 1)
    # a wait without its receive, a wait before its receive
    bad = {0: [F(0, 0), S(0, T.FWD_SEND, 0), S(0, T.BWD_RECV, 0), S(0, T.BWD_WAIT, 0), B(0, 0)],
           1: [S(0, T.FWD_WAIT, 1), F(0, 1), B(0, 1), S(0, T.BWD_SEND, 1)]}
    with pytest.raises(ScheduleError, match=r"rank 1, step 0, WAIT_F0@s1: no RECV_F0@s1 on rank 1 for this wait"):
        validate_schedule(bad, 2, 1, blocking_send=False)
    bad[1].insert(1, S(0, T.FWD_RECV, 1))
    with pytest.raises(ScheduleError, match=r"WAIT_F0@s1: needs RECV_F0@s1 earlier on rank 1: a wait comes after "
                                            r"the receive it completes \[rule: order\]"):
        validate_schedule(bad, 2, 1, blocking_send=False)
    # with its receive first the order is valid in both models (a wait is a no-op when blocking)
    bad[1][0], bad[1][1] = bad[1][1], bad[1][0]
    validate_schedule(bad, 2, 1, blocking_send=False)
    validate_schedule(bad, 2, 1)
    with pytest.raises(ScheduleError, match=r"blocking_send='no' must be True"):
        validate_schedule(bad, 2, 1, blocking_send="no")


# --- compute orders are checked before communication is added -----------------------------------

def one_f_one_b(p, m):
    out = {}
    for r in range(p):
        w = min(p - 1 - r, m)
        steps = [F(i, r) for i in range(w)]
        for i in range(m - w):
            steps += [F(w + i, r), B(i, r)]
        out[r] = steps + [B(i, r) for i in range(m - w, m)]
    return out


def test_missing_first_forward_and_extra_microbatch_on_the_last_rank():
    """Issue 20's case: a 1F1B order whose last rank lacks F0 and has F4 of 4 microbatches is
    reported at that step, not as a rank waiting in a cycle."""
    order = one_f_one_b(4, 4)
    order[3] = [F(4, 3) if s == F(0, 3) else s for s in order[3]]
    with pytest.raises(ScheduleError) as err:
        add_communication(order, range(4), 4, micro_batch_num=4)
    e = err.value
    assert (e.rank, e.index, e.step, e.rule) == (3, 0, F(4, 3), "placement")
    assert str(e) == ("rank 3, step 0, F4@s3: (microbatch 4, stage 3): microbatch 4 does not exist "
                      "(micro_batch_num=4, microbatches 0..3) [rule: placement]")
    # without micro_batch_num the same step is reported by what it lacks
    with pytest.raises(ScheduleError, match=r"rank 3, step 0, F4@s3: \(microbatch 4, stage 3\): F4@s3 has no "
                                            r"backward \(B4@s3, or I4@s3 and W4@s3\) on rank 3 \[rule: complete\]"):
        add_communication(order, range(4), 4)
    order[3][0] = F(0, 3)                                   # the fixed order goes through
    validate_schedule(add_communication(order, range(4), 4, micro_batch_num=4), 4, 4)


@pytest.mark.parametrize("mutate, message", [
    (lambda o: o[1].remove(F(2, 1)), r"rank 1, step \d+, B2@s1: \(microbatch 2, stage 1\): B2@s1 has no F2@s1"),
    (lambda o: o[0].append(F(1, 0)), r"rank 0, step 8, F1@s0: \(microbatch 1, stage 0\): F1@s0 appears twice "
                                     r"\(first at rank 0 step 1\) \[rule: unique\]"),
    (lambda o: o[0].append(F(0, 1)), r"rank 0, step 8, F0@s1: .*stage 1 lives on rank 1, not on rank 0"),
    (lambda o: o[0].append(F(0, 7)), r"stage 7 does not exist \(stage_num=2, stages 0..1\)"),
    (lambda o: o[1].remove(B(3, 1)), r"rank 1, step 6, F3@s1: \(microbatch 3, stage 1\): F3@s1 has no backward"),
    (lambda o: o[0].insert(0, o[0].pop(o[0].index(B(0, 0)))),
     r"rank 0, step 0, B0@s0: \(microbatch 0, stage 0\): B0@s0 needs F0@s0, which comes at step 1, later"),
    (lambda o: o[0].insert(0, MetaStep(0, T.FWD_SEND, 0)), r"FWD_SEND is communication \(add_communication adds it\)"),
    (lambda o: o[0].__setitem__(o[0].index(B(3, 0)), I(3, 0)), r"I3@s0 has no W3@s0: a split backward needs both"),
    (lambda o: o[0].extend([I(4, 0)]), r"microbatch 4 does not exist"),
])
def test_compute_order_mistakes_name_rank_step_microbatch_stage(mutate, message):
    order = one_f_one_b(2, 4)
    mutate(order)
    with pytest.raises(ScheduleError, match=message):
        validate_compute_order(order, (0, 1), 2, 4)


def test_cross_rank_cycle_is_reported_as_data_flow_not_as_a_wait_cycle():
    # rank 1 runs B0 first: it needs F0@s1, which it only runs later; rank 0 runs B0@s0 before
    # any forward left... here: rank 0 wants the gradient of microbatch 1 before forwarding it
    order = {0: [F(0, 0), B(1, 0), F(1, 0), B(0, 0)], 1: [F(0, 1), B(0, 1), F(1, 1), B(1, 1)]}
    with pytest.raises(ScheduleError) as err:
        add_communication(order, (0, 1), 2)
    assert err.value.rule == "order"
    assert "B1@s0 needs F1@s0, which comes at step 2, later on rank 0" in str(err.value)
    order = {0: [F(0, 0), B(0, 0), F(1, 0), B(1, 0)], 1: [F(1, 1), B(1, 1), F(0, 1), B(0, 1)]}
    with pytest.raises(ScheduleError) as err:
        add_communication(order, (0, 1), 2)
    e = err.value
    assert e.rule == "dataflow" and (e.rank, e.index) == (0, 1)
    assert ("rank 0 step 1 B0@s0 (microbatch 0, stage 0) needs B0@s1 (rank 1 step 3), but rank 1 is stuck at "
            "step 0 F1@s1") in str(e)
    assert "rank 1 step 0 F1@s1 (microbatch 1, stage 1) needs F1@s0 (rank 0 step 2), but rank 0 is stuck at step 1 " \
        "B0@s0" in str(e)


def test_costs_check_overlap():
    with pytest.raises(ValueError, match=r"overlap=1.5 must be in \[0, 1\]"):
        StepCosts(overlap=1.5)
    with pytest.raises(ValueError, match=r"overlap=-0.1 must be a finite number >= 0"):
        StepCosts(overlap=-0.1)


def test_random_compute_orders_posted_reach_the_ideal_and_lower_to_blocking():
    """Random feasible compute orders (some with overlapped units), any placement: the posted
    order validates, finishes at the ideal makespan, its blocking lowering validates; the blocking
    order validates posted too (blocking-valid implies posted-valid)."""
    import random
    from mindformers_core.pipeline.meta_step import consumes
    rng = random.Random(1)
    for _ in range(40):
        p, v, m = rng.choice([2, 3, 4]), rng.choice([1, 2]), rng.randint(1, 5)
        placement = stage_placement(rng.choice(["interleaved", "v"]), p, v)
        n = p * v
        kinds = (T.FWD, T.BWD_INPUT, T.BWD_WEIGHT) if rng.random() < 0.5 else (T.FWD, T.BWD)
        todo = {MetaStep(i, t, s) for i in range(m) for s in range(n) for t in kinds}
        done, order = set(), {r: [] for r in range(p)}
        while todo:                                  # random topological order
            ready = sorted((s for s in todo if all(d in done for d in consumes(s, n))), key=repr)
            step = rng.choice(ready)
            todo.remove(step)
            # sometimes overlap a ready forward with a ready backward of the same rank
            rank = placement[step.stage_index]
            mates = [b for b in ready if b is not step and b.type in (T.BWD, T.BWD_INPUT)
                     and placement[b.stage_index] == rank and step.type is T.FWD
                     and (b.micro_index, b.stage_index) != (step.micro_index, step.stage_index)]
            if mates and rng.random() < 0.5:
                mate = rng.choice(mates)
                todo.remove(mate)
                order[rank].append(MetaStep.overlapped(step, mate))
                done.update(produces_all(mate))
            else:
                order[rank].append(step)
            done.update(produces_all(step) or [("w", step)])
        costs = StepCosts(rng.choice([1.0, 1.5]), rng.choice([2.0, 3.0]), overlap=rng.choice([0.0, 1.0]))
        posted = add_communication(order, placement, n, costs, blocking_send=False)
        validate_schedule(posted, n, m, placement, blocking_send=False)
        tl = simulate(posted, costs.fwd_time, costs.bwd_time, blocking_send=False, overlap=costs.overlap)
        assert tl.makespan == pytest.approx(ideal_makespan(order, n, costs))
        validate_schedule(lower_for_runtime(posted, n, m, placement), n, m, placement)
        blocking = add_communication(order, placement, n, costs)
        validate_schedule(blocking, n, m, placement)
        validate_schedule(blocking, n, m, placement, blocking_send=False)


def test_subclass_building_a_broken_compute_order_is_told_where():
    """The same 1F1B bug through a schedule subclass that adds communication itself."""
    from mindformers_core.pipeline import PipelineScheduleSingle, StageInfo

    class Buggy1F1B(PipelineScheduleSingle):
        def construct_exec_order(self):
            order = one_f_one_b(self.stage_num, self.micro_batch_num)
            last = self.stage_num - 1
            order[last] = [F(self.micro_batch_num, last) if s == F(0, last) else s for s in order[last]]
            self.exec_order.update(add_communication(order, self.placement, self.stage_num,
                                                     micro_batch_num=self.micro_batch_num))

    with pytest.raises(ScheduleError, match=r"^rank 3, step 0, F4@s3: \(microbatch 4, stage 3\): microbatch 4 does "
                                            r"not exist \(micro_batch_num=4, microbatches 0..3\)"):
        Buggy1F1B(StageInfo(0, 4), 4)
