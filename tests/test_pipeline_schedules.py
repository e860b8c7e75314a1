"""Pipeline schedules as data: the design's GPipe example, built-in schedules, validator, simulator
and visualizer. Pure logic, no process group."""
import json
import random

import pytest

from mindformers_core.pipeline import (
    DeadlockError, MetaStep, MetaStepType, PipelineScheduleMulti, PipelineScheduleSingle, Schedule1F1B,
    ScheduleDualPipeV, ScheduleError, ScheduleInterleaved1F1B, ScheduleZeroBubbleH1, ScheduleZeroBubbleV,
    StageInfo, StepCosts, Timeline, add_communication, render_text, simulate,
    stages_of_rank, to_chrome_trace, validate_schedule)
from mindformers_core.common.placement import stage_placement
from mindformers_core.pipeline import ScheduleGPipe as BuiltinGPipe    # the design's name is taken below
from mindformers_core.pipeline.compute_order import compute_only
from mindformers_core.pipeline.meta_step import consumes, produces

T = MetaStepType


# --- the design's user-written GPipe, as written (only the imports above are ours) -------------

class ScheduleGPipe(PipelineScheduleSingle):
    """
    The Gpipe schedule. It first executes all forward micro batches and then execute all backward micro batches.
    """
    def construct_exec_order(self):
        for stage_index in range(self.stage.stage_num):
            order_list = []
            for mb_index in range(self.micro_batch_num):
                if stage_index != 0:
                    order_list.append(MetaStep(mb_index, MetaStepType.FWD_RECV, stage_index))
                order_list.append(MetaStep(mb_index, MetaStepType.FWD, stage_index))
                if stage_index != self.stage.stage_num - 1:
                    order_list.append(MetaStep(mb_index, MetaStepType.FWD_SEND, stage_index))
            for mb_index in range(self.micro_batch_num):
                if stage_index != self.stage.stage_num - 1:
                    order_list.append(MetaStep(mb_index, MetaStepType.BWD_RECV, stage_index))
                order_list.append(MetaStep(mb_index, MetaStepType.BWD, stage_index))
                if stage_index != 0:
                    order_list.append(MetaStep(mb_index, MetaStepType.BWD_SEND, stage_index))
            self.exec_order[stage_index] = order_list


def bubble_formula(p, m):
    return (p - 1) / (m + p - 1)


@pytest.mark.parametrize("p, m", [(1, 1), (2, 3), (4, 8), (3, 2)])
def test_design_gpipe_builds_validates_and_matches_builtin(p, m):
    design = ScheduleGPipe(StageInfo(0, p), micro_batch_num=m)       # constructing validates
    assert sorted(design.exec_order) == list(range(p))
    validate_schedule(design.exec_order, p, m)
    # the built-in derives its sends/receives automatically and lands on the same order
    assert BuiltinGPipe(StageInfo(0, p), m).exec_order == design.exec_order
    assert simulate(design).bubble_ratio == pytest.approx(bubble_formula(p, m))


def test_design_gpipe_last_stage_order_reads_like_the_design():
    order = ScheduleGPipe(StageInfo(1, 2), 2).exec_order
    assert [repr(s) for s in order[1]] == ["RECV_F0@s1", "F0@s1", "RECV_F1@s1", "F1@s1",
                                           "B0@s1", "SEND_B0@s1", "B1@s1", "SEND_B1@s1"]


# --- MetaStep and placement --------------------------------------------------------------------

def test_meta_step_is_positional_frozen_and_readable():
    step = MetaStep(3, T.FWD, 1)
    assert (step.micro_index, step.type, step.stage_index) == (3, T.FWD, 1)
    assert repr(step) == "F3@s1"
    assert [repr(MetaStep(0, t, 2)) for t in (T.BWD_INPUT, T.BWD_WEIGHT, T.FWD_SEND, T.BWD_RECV)] == \
        ["I0@s2", "W0@s2", "SEND_F0@s2", "RECV_B0@s2"]
    assert MetaStep(0, T.FWD_SEND, 1).peer() == MetaStep(0, T.FWD_RECV, 2)
    assert MetaStep(0, T.BWD_SEND, 1).peer() == MetaStep(0, T.BWD_RECV, 0)
    with pytest.raises(AttributeError):
        step.micro_index = 4
    with pytest.raises(ValueError, match=r"micro_index=-1 must be a non-negative integer"):
        MetaStep(-1, T.FWD, 0)
    with pytest.raises(TypeError, match=r"type='FWD' must be a MetaStepType"):
        MetaStep(0, "FWD", 0)
    with pytest.raises(ValueError, match=r"F0@s0 is not a send or receive"):
        step.__class__(0, T.FWD, 0).peer()


def test_placements_loop_and_v():
    assert stage_placement("interleaved", 4, 2) == (0, 1, 2, 3, 0, 1, 2, 3)
    assert stage_placement("v", 4, 2) == (0, 1, 2, 3, 3, 2, 1, 0)
    assert [s.stage_index for s in stages_of_rank(1, 4, 2, "v")] == [1, 6]
    assert [s.stage_index for s in stages_of_rank(1, 4, 2)] == [1, 5]
    with pytest.raises(ValueError, match=r"placement='zigzag'; valid names are"):
        stage_placement("zigzag", 4, 2)
    with pytest.raises(ValueError, match=r"must give every rank exactly 1 stage"):
        stage_placement([0, 0], 2, 1)
    with pytest.raises(ValueError, match=r"stage_index=4 must be an integer in \[0, 4\)"):
        StageInfo(4, 4)
    with pytest.raises(ValueError, match=r"stage_num=0 must be a positive integer"):
        StageInfo(0, 0)


# --- built-in schedules ------------------------------------------------------------------------

SINGLE = [BuiltinGPipe, Schedule1F1B, ScheduleZeroBubbleH1]


def build(cls, p, m, rank=0):
    if cls is ScheduleInterleaved1F1B:
        return cls(stages_of_rank(rank, p, 2), m)
    if cls in (ScheduleZeroBubbleV, ScheduleDualPipeV):
        return cls(stages_of_rank(rank, p, 2, "v"), m)
    return cls(StageInfo(rank, p), m)


ALL = SINGLE + [ScheduleInterleaved1F1B, ScheduleZeroBubbleV, ScheduleDualPipeV]


@pytest.mark.parametrize("cls", ALL)
@pytest.mark.parametrize("p", [1, 2, 4])
def test_builtin_validates_for_m_p_2p_2p_plus_1(cls, p):
    for m in (p, 2 * p, 2 * p + 1):
        if cls is ScheduleDualPipeV and m < 2 * p:
            continue                           # rejected, see test_pipeline_dualpipe.py
        sched = build(cls, p, m)
        validate_schedule(sched.exec_order, sched.stage_num, m, sched.placement)
        steps = [s for order in sched.exec_order.values() for s in order]
        computes = [part for s in steps if s.type.is_compute for part in s.parts]
        per_mb_stage = 3 if cls in (ScheduleZeroBubbleH1, ScheduleZeroBubbleV) else 2
        if cls is ScheduleDualPipeV:           # some backwards split (I + W), the others whole
            per_mb_stage = 2
            computes = [s for s in computes if s.type is not T.BWD_WEIGHT]
        assert len(computes) == per_mb_stage * m * sched.stage_num
        # every rank builds the same global order
        assert build(cls, p, m, rank=p - 1).exec_order == sched.exec_order


@pytest.mark.parametrize("cls", ALL)
def test_builtin_sends_only_between_ranks_and_hands_off_within_one(cls):
    p, m = 4, 8
    sched = build(cls, p, m)
    rank_of = sched.placement
    for rank, order in sched.exec_order.items():
        for step in order:
            if step.type.is_p2p:
                assert rank_of[step.neighbour_stage] != rank, step
            if step.type.is_handoff:
                assert rank_of[step.neighbour_stage] == rank, step
    handoffs = [s for s in sched.exec_order[p - 1] if s.type.is_handoff]
    if cls in (ScheduleZeroBubbleV, ScheduleDualPipeV):   # the bottom of the V: stages p-1, p on rank p-1
        assert sorted(map(repr, handoffs)) == sorted([f"HANDOFF_F{i}@s{p - 1}" for i in range(m)]
                                                     + [f"HANDOFF_B{i}@s{p}" for i in range(m)])
    else:
        assert handoffs == []


def test_two_virtual_stages_on_one_rank_use_handoffs_only():
    sched = ScheduleInterleaved1F1B([StageInfo(0, 2), StageInfo(1, 2)], 1)   # pp=1, v=2
    assert [repr(s) for s in sched.exec_order[0]] == ["F0@s0", "HANDOFF_F0@s0", "F0@s1", "B0@s1",
                                                      "HANDOFF_B0@s1", "B0@s0"]


def test_random_compute_orders_get_deadlock_free_communication():
    """add_communication on arbitrary feasible compute orders, any placement and costs: the
    result always validates (no deadlock under blocking send/recv)."""
    rng = random.Random(0)
    for _ in range(40):
        p, v, m = rng.choice([2, 3, 4]), rng.choice([1, 2]), rng.randint(1, 5)
        placement = stage_placement(rng.choice(["interleaved", "v"]), p, v)
        split = rng.random() < 0.5
        n = p * v
        kinds = (T.FWD, T.BWD_INPUT, T.BWD_WEIGHT) if split else (T.FWD, T.BWD)
        todo = {MetaStep(i, t, s) for i in range(m) for s in range(n) for t in kinds}
        done, order = set(), {r: [] for r in range(p)}
        while todo:                                  # random topological order
            ready = sorted((s for s in todo if all(d in done for d in consumes(s, n))), key=repr)
            step = rng.choice(ready)
            todo.remove(step)
            done.add(produces(step) or ("w", step))
            order[placement[step.stage_index]].append(step)
        costs = StepCosts(rng.choice([1.0, 1.5]), rng.choice([2.0, 3.0]))
        full = add_communication(order, placement, n, costs)
        validate_schedule(full, n, m, placement)
        assert [s for s in full[0] if s.type.is_compute] == order[0]


@pytest.mark.parametrize("p, m", [(4, 5), (4, 6), (4, 7), (4, 9), (4, 10), (2, 3), (3, 4), (5, 7), (5, 12)])
def test_interleaved_any_microbatch_count_reaches_the_ideal_makespan(p, m):
    """m not a multiple of p: microbatches go in m // p groups of >= p; the bubble is the one of
    equal stages, (p-1)/(vm+p-1), i.e. makespan 3(vm+p-1) with F=1, B=2 — blocking send/recv too."""
    v = 2
    sched = build(ScheduleInterleaved1F1B, p, m)
    tl = simulate(sched)
    assert tl.makespan == 3 * (v * m + p - 1)
    assert tl.bubble_ratio == pytest.approx((p - 1) / (v * m + p - 1))
    assert simulate(sched, blocking_send=False).makespan == tl.makespan


def test_interleaved_microbatch_groups():
    from mindformers_core.pipeline.schedules import microbatch_groups
    assert [list(g) for g in microbatch_groups(6, 4)] == [list(range(6))]
    assert [len(g) for g in microbatch_groups(10, 4)] == [5, 5]
    assert [len(g) for g in microbatch_groups(9, 4)] == [5, 4]
    assert [len(g) for g in microbatch_groups(8, 4)] == [4, 4]            # Megatron's groups of p
    assert [len(g) for g in microbatch_groups(2, 4)] == [2]
    # fewer microbatches than ranks: valid, the pipeline never fills
    sched = build(ScheduleInterleaved1F1B, 4, 2)
    validate_schedule(sched.exec_order, 8, 2, sched.placement)


def test_1f1b_accepts_fewer_microbatches_than_stages():
    sched = Schedule1F1B(StageInfo(0, 4), 2)          # valid, the pipeline just never fills
    assert simulate(sched).bubble_ratio == pytest.approx(bubble_formula(4, 2))


@pytest.mark.parametrize("make, message", [
    (lambda: Schedule1F1B(StageInfo(0, 4), 0), r"Schedule1F1B: micro_batch_num=0 must be a positive integer"),
    (lambda: BuiltinGPipe(StageInfo(0, 4), 2.0), r"micro_batch_num=2.0 must be a positive integer"),
    (lambda: ScheduleZeroBubbleV([StageInfo(0, 4)], 4),
     r"got 1 stage\(s\) for this rank; ZBV needs exactly 2"),
    (lambda: ScheduleInterleaved1F1B([StageInfo(0, 8), StageInfo(1, 8)], 4),
     r"stages \[0, 1\] are not the stages of one rank .* ranks hold \{0: \[0, 4\], 1: \[1, 5\]\}"),
    (lambda: ScheduleInterleaved1F1B([StageInfo(0, 8), StageInfo(4, 6)], 4), r"disagree on stage_num"),
    (lambda: PipelineScheduleMulti([], 4), r"stages is empty"),
])
def test_bad_schedule_arguments_name_argument_and_value(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_stage_objects_need_index_and_count():
    with pytest.raises(TypeError, match=r"needs integer attributes stage_index and stage_num"):
        Schedule1F1B(object(), 4)


def test_broken_custom_schedule_is_rejected_at_construction():
    class ForwardOnly(PipelineScheduleSingle):
        def construct_exec_order(self):
            self.exec_order[0] = [MetaStep(0, T.FWD, 0)]

    with pytest.raises(ScheduleError,
                       match=r"missing B0@s0 on rank 0 \(microbatch 0, stage 0\) \[rule: complete\]"):
        ForwardOnly(StageInfo(0, 1), 1)

    class Nothing(PipelineScheduleSingle):
        pass

    with pytest.raises(NotImplementedError, match=r"Nothing must implement construct_exec_order"):
        Nothing(StageInfo(0, 1), 1)


def test_schedule_of_stage_infos_cannot_run():
    sched = Schedule1F1B(StageInfo(0, 2), 2)
    assert sched.local_order == sched.exec_order[0]
    with pytest.raises(TypeError, match=r"is not a PipelineStage"):
        sched.run(None)


# --- validator: each rule with its message -----------------------------------------------------

def gpipe2(m=1):
    return {r: list(steps) for r, steps in ScheduleGPipe(StageInfo(0, 2), m).exec_order.items()}


def F(m, s): return MetaStep(m, T.FWD, s)                      # noqa: E704
def B(m, s): return MetaStep(m, T.BWD, s)                      # noqa: E704


def test_validator_catches_missing_backward():
    order = gpipe2(2)
    order[1].remove(B(1, 1))
    with pytest.raises(ScheduleError,
                       match=r"missing B1@s1 on rank 1 \(microbatch 1, stage 1\) \[rule: complete\]"):
        validate_schedule(order, 2, 2)


def test_validator_catches_send_without_recv():
    order = gpipe2()
    order[1].remove(MetaStep(0, T.FWD_RECV, 1))
    with pytest.raises(ScheduleError) as err:
        validate_schedule(order, 2, 1)
    assert str(err.value) == "rank 0, step 1, SEND_F0@s0: no matching RECV_F0@s1 on rank 1 [rule: matching]"
    assert (err.value.rank, err.value.index, err.value.rule) == (0, 1, "matching")


def test_validator_catches_recv_without_send():
    order = gpipe2()
    order[1].remove(MetaStep(0, T.BWD_SEND, 1))
    with pytest.raises(ScheduleError, match=r"rank 0, step 2, RECV_B0@s0: no matching SEND_B0@s1 on rank 1"):
        validate_schedule(order, 2, 1)


def test_validator_catches_deadlock_both_ranks_receiving_first():
    order = {0: [MetaStep(0, T.BWD_RECV, 0), F(0, 0), MetaStep(0, T.FWD_SEND, 0), B(0, 0)],
             1: [MetaStep(0, T.FWD_RECV, 1), F(0, 1), B(0, 1), MetaStep(0, T.BWD_SEND, 1)]}
    with pytest.raises(DeadlockError) as err:
        validate_schedule(order, 2, 1)
    e = err.value
    assert e.rule == "deadlock" and e.cycle == (0, 1)
    assert e.stuck == {0: (0, MetaStep(0, T.BWD_RECV, 0), 1), 1: (0, MetaStep(0, T.FWD_RECV, 1), 0)}
    assert "rank 0 waits at step 0 RECV_B0@s0 for SEND_B0@s1 on rank 1 (which waits at RECV_F0@s1)" in str(e)
    assert "wait cycle: rank 0 -> rank 1 -> rank 0" in str(e)


def test_validator_catches_crossing_blocking_sends_in_naive_1f1b():
    """Send right after the forward, receive right before the backward: 1F1B with two ranks then
    has rank 0 sending F1 while rank 1 sends B0; blocking sends never meet."""
    S = lambda m, t, s: MetaStep(m, t, s)                       # noqa: E731
    order = {0: [F(0, 0), S(0, T.FWD_SEND, 0), F(1, 0), S(1, T.FWD_SEND, 0),
                 S(0, T.BWD_RECV, 0), B(0, 0), S(1, T.BWD_RECV, 0), B(1, 0)],
             1: [S(0, T.FWD_RECV, 1), F(0, 1), B(0, 1), S(0, T.BWD_SEND, 1),
                 S(1, T.FWD_RECV, 1), F(1, 1), B(1, 1), S(1, T.BWD_SEND, 1)]}
    with pytest.raises(DeadlockError, match=r"rank 0 waits at step 3 SEND_F1@s0 for RECV_F1@s1 on rank 1 "
                                            r"\(which waits at SEND_B0@s1\)"):
        validate_schedule(order, 2, 2)
    # the built-in 1F1B orders the same compute so that the messages meet
    validate_schedule(Schedule1F1B(StageInfo(0, 2), 2).exec_order, 2, 2)


@pytest.mark.parametrize("order, message", [
    ({0: [B(0, 0), F(0, 0)]},
     r"rank 0, step 0, B0@s0: needs F0@s0 earlier on rank 0: a backward comes after its forward"),
    ({0: [F(0, 0), MetaStep(0, T.BWD_WEIGHT, 0), MetaStep(0, T.BWD_INPUT, 0)]},
     r"rank 0, step 1, W0@s0: needs I0@s0 earlier on rank 0: BWD_WEIGHT comes after BWD_INPUT"),
])
def test_validator_catches_wrong_order_on_one_stage(order, message):
    with pytest.raises(ScheduleError, match=message + r" \[rule: order\]"):
        validate_schedule(order, 1, 1)


def test_validator_catches_forward_before_its_input_arrives():
    order = gpipe2()
    order[1][0], order[1][1] = order[1][1], order[1][0]            # F0@s1 before RECV_F0@s1
    with pytest.raises(ScheduleError, match=r"rank 1, step 0, F0@s1: needs RECV_F0@s1 earlier on rank 1: "
                                            r"a forward needs its input from the previous stage first"):
        validate_schedule(order, 2, 1)


def test_validator_catches_send_before_the_data_exists():
    order = gpipe2()
    order[1][-2], order[1][-1] = order[1][-1], order[1][-2]        # SEND_B0@s1 before B0@s1
    with pytest.raises(ScheduleError, match=r"rank 1, step 2, SEND_B0@s1: needs B0@s1 earlier on rank 1"):
        validate_schedule(order, 2, 1)


@pytest.mark.parametrize("mutate, message", [
    (lambda o: o[0].append(F(0, 1)),
     r"rank 0, step 4, F0@s1: stage 1 lives on rank 1, not on rank 0 \[rule: placement\]"),
    (lambda o: o[0].append(F(0, 0)),
     r"rank 0, step 4, F0@s0: appears twice \(first at rank 0 step 0\) \[rule: unique\]"),
    (lambda o: o[0].append(F(5, 0)), r"microbatch 5 does not exist \(micro_batch_num=1\)"),
    (lambda o: o[1].append(MetaStep(0, T.FWD_SEND, 1)), r"FWD_SEND talks to stage 2, which does not exist"),
    (lambda o: o[0].append(MetaStep(0, T.FWD_HANDOFF, 0)),
     r"a handoff only joins stages of one rank; use send/recv"),
    (lambda o: o[0].append(MetaStep(0, T.BWD_INPUT, 0)),
     r"has both a full backward and a split one \(I0@s0\)"),
    (lambda o: o[0].append("F0"), r"rank 0, step 4: 'F0' is a str, not a MetaStep \[rule: input\]"),
    (lambda o: o.pop(1), r"stage 1 lives on rank 1 \(placement\), but exec_order has no list for rank 1"),
])
def test_validator_placement_and_shape_rules(mutate, message):
    order = gpipe2()
    mutate(order)
    with pytest.raises(ScheduleError, match=message):
        validate_schedule(order, 2, 1)


def test_validator_wants_handoff_between_stages_of_one_rank():
    order = {0: [F(0, 0), MetaStep(0, T.FWD_SEND, 0)]}
    with pytest.raises(ScheduleError,
                       match=r"stage 1 is on the same rank: use FWD_HANDOFF, not a send/recv to itself"):
        validate_schedule(order, 2, 1, placement=[0, 0])


@pytest.mark.parametrize("args, message", [
    ((0, 1), r"stage_num=0 must be a positive integer \[rule: input\]"),
    ((2, -1), r"micro_batch_num=-1 must be a positive integer"),
])
def test_validator_bad_sizes(args, message):
    with pytest.raises(ScheduleError, match=message):
        validate_schedule(gpipe2(), *args)


def test_validator_accepts_named_placement():
    sched = build(ScheduleZeroBubbleV, 2, 4)
    validate_schedule(sched.exec_order, 4, 4, "v")
    with pytest.raises(ScheduleError,
                       match=r"rank 0, step \d+, RECV_F0@s3: stage 3 lives on rank 1, not on rank 0"):
        validate_schedule(sched.exec_order, 4, 4, "interleaved")


# --- simulator: known formulas -----------------------------------------------------------------

@pytest.mark.parametrize("p, m", [(1, 3), (2, 2), (2, 5), (4, 8), (4, 3), (8, 16)])
def test_gpipe_and_1f1b_bubble_formula_and_peak_activations(p, m):
    gpipe, one = simulate(build(BuiltinGPipe, p, m)), simulate(build(Schedule1F1B, p, m))
    for tl in (gpipe, one):
        assert tl.bubble_ratio == pytest.approx(bubble_formula(p, m))
        assert tl.makespan == pytest.approx(3 * (m + p - 1))            # F=1, B=2
    assert gpipe.peak_in_flight == {r: m for r in range(p)}
    assert one.peak_in_flight == {r: min(p - r, m) for r in range(p)}


@pytest.mark.parametrize("p, m", [(2, 4), (3, 6), (4, 8), (4, 16), (5, 10)])
def test_interleaved_bubble_shrinks_by_the_virtual_stage_count(p, m):
    v = 2
    tl = simulate(build(ScheduleInterleaved1F1B, p, m))
    assert tl.bubble_ratio == pytest.approx((p - 1) / (v * m + p - 1))
    assert tl.bubble_ratio < simulate(build(Schedule1F1B, p, m)).bubble_ratio


def test_interleaved_keeps_megatron_warmup_unless_blocking_sends_need_a_stagger():
    v = 2
    megatron = lambda p, r: 2 * (p - 1 - r) + (v - 1) * p + 1                 # noqa: E731
    assert simulate(build(ScheduleInterleaved1F1B, 4, 8)).peak_in_flight == \
        {r: megatron(4, r) for r in range(4)}
    # p % 3 == 2: odd ranks warm up one forward more, or every period a send would wait
    assert simulate(build(ScheduleInterleaved1F1B, 5, 10)).peak_in_flight == \
        {r: megatron(5, r) + r % 2 for r in range(5)}


@pytest.mark.parametrize("p, m", [(2, 4), (4, 4), (4, 8), (8, 16)])
def test_zb_h1_bubble_is_a_third_and_memory_is_1f1b(p, m):
    tl = simulate(build(ScheduleZeroBubbleH1, p, m))                  # F = I = W = 1
    assert tl.bubble_ratio == pytest.approx((p - 1) / (3 * m + p - 1))
    assert tl.peak_in_flight == {r: min(p - r, m) for r in range(p)}              # as 1F1B
    # with the r delayed weight gradients, rank r holds up to p microbatches: 1F1B's rank-0 peak
    assert tl.peak_until_weight_grad == {r: min(p, m) for r in range(p)}


@pytest.mark.parametrize("p", [2, 4])
def test_zbv_bubble_below_1f1b(p):
    for m in (p, 2 * p, 2 * p + 1):
        zbv, one = simulate(build(ScheduleZeroBubbleV, p, m)), simulate(build(Schedule1F1B, p, m))
        assert zbv.bubble_ratio < one.bubble_ratio
        # 2p stage activations of half a rank's layers each = p full microbatches, 1F1B's rank-0 peak
        assert max(zbv.peak_until_weight_grad.values()) <= 2 * p


def test_zbv_reaches_the_lower_bound_for_p4_m8():
    tl = simulate(build(ScheduleZeroBubbleV, 4, 8))
    # each rank computes 2 stages x 8 microbatches x (F + I + W) = 48; the last rank cannot start
    # before the first 3 forwards are done: 48 + 3
    assert tl.makespan == 51
    assert tl.bubble_per_rank[3] == pytest.approx(3 / 51)


def test_split_backward_costs_default_to_half_of_bwd_time():
    assert StepCosts(1.0, 3.0).bwd_input_time == 1.5
    assert StepCosts(1.0, 3.0, bwd_input_time=1.0).bwd_weight_time == 2.0
    tl = simulate(build(ScheduleZeroBubbleH1, 1, 2), bwd_input_time=2.0, bwd_weight_time=0.5)
    assert tl.makespan == 2 * (1 + 2 + 0.5)


def test_comm_time_blocking_vs_async_sends():
    sched = build(BuiltinGPipe, 2, 2)
    # worked by hand: a blocking send keeps the sender busy until its receive is done
    assert simulate(sched, comm_time=0.5).makespan == 11.0
    # posted sends, but each receive posted only where its data is used: the transfer starts when
    # both sides are posted, so F1's transfer waits for rank 1 to reach RECV_F1 (after F0@s1)
    assert simulate(sched, comm_time=0.5, blocking_send=False).makespan == 11.0
    # receives posted early and completed by wait steps: every transfer hides behind compute
    posted = add_communication(compute_only(sched.exec_order), sched.placement, 2, blocking_send=False)
    assert [repr(s) for s in posted[1][:4]] == ["RECV_F0@s1", "RECV_F1@s1", "WAIT_F0@s1", "F0@s1"]
    assert simulate(posted, comm_time=0.5, blocking_send=False).makespan == 10.0
    tl = simulate(sched, comm_time=0.5)
    recv = next(t for t in tl.steps[1] if t.step == MetaStep(0, T.FWD_RECV, 1))
    assert (recv.start, recv.end) == (0.0, 1.5)                      # waits for F0@s0, then transfers


def test_simulate_a_bare_exec_order_reads_sizes_off_the_steps():
    order = build(Schedule1F1B, 4, 8).exec_order
    assert simulate(order).bubble_ratio == pytest.approx(bubble_formula(4, 8))
    broken = {r: list(s) for r, s in order.items()}
    broken[3].remove(B(7, 3))
    with pytest.raises(ScheduleError, match=r"missing B7@s3"):
        simulate(broken)


@pytest.mark.parametrize("kwargs, message", [
    (dict(fwd_time=0), r"fwd_time=0 must be a finite number > 0"),
    (dict(bwd_time=-2.0), r"bwd_time=-2.0 must be a finite number > 0"),
    (dict(comm_time=-1), r"comm_time=-1 must be a finite number >= 0"),
    (dict(bwd_input_time=2.0), r"bwd_input_time=2.0 leaves no time for the weight gradient"),
    (dict(fwd_time=float("inf")), r"fwd_time=inf must be a finite number > 0"),
])
def test_simulator_bad_costs(kwargs, message):
    with pytest.raises(ValueError, match=message):
        simulate(build(BuiltinGPipe, 2, 2), **kwargs)


# --- visualizer --------------------------------------------------------------------------------

@pytest.mark.parametrize("cls", ALL)
def test_text_chart_shows_every_compute_step_on_its_rank(cls):
    sched = build(cls, 4, 8)
    chart = render_text(sched)
    lines = chart.splitlines()
    assert len(lines) == 1 + 4 + 1                                     # time axis, ranks, summary
    several = sched.stages_per_rank > 1
    for rank, order in sched.exec_order.items():
        row = lines[1 + rank]
        assert row.startswith(f"rank {rank} |")
        cells = row.split("|", 1)[1].replace("-", " ").split()
        labels = [repr(s) if several else f"{s.type.value}{s.micro_index}"
                  for s in order if s.type.is_compute]
        assert [c for c in cells if c != "."] == labels              # all of them, in order
    assert f"bubble {simulate(sched).bubble_ratio:.1%}" in lines[-1]


def test_text_chart_draws_time_and_idle():
    chart = render_text(simulate(build(Schedule1F1B, 2, 2)))
    assert chart.splitlines()[1:3] == ["rank 0 |F0 F1 .  .  B0--- .  B1---",
                                       "rank 1 |.  F0 B0--- F1 B1--- .  ."]
    assert render_text(build(Schedule1F1B, 2, 2).exec_order) == chart   # a bare exec order works too
    with pytest.raises(ValueError, match=r"unit=-1 must be > 0"):
        render_text(build(Schedule1F1B, 2, 2), unit=-1)


def test_chrome_trace_has_every_step_and_is_json():
    sched = build(ScheduleZeroBubbleV, 2, 3)
    tl = simulate(sched)
    trace = json.loads(json.dumps(to_chrome_trace(tl)))
    events = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert sorted(e["name"] for e in events) == sorted(repr(s) for o in sched.exec_order.values() for s in o)
    f0 = next(e for e in events if e["name"] == "F0@s0")
    assert (f0["tid"], f0["ts"], f0["dur"], f0["cat"]) == (0, 0.0, 1000.0, "compute")
    assert {e["cat"] for e in events} == {"compute", "comm", "handoff"}
    names = {e["tid"]: e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"}
    assert names == {0: "rank 0", 1: "rank 1"}
    assert isinstance(tl, Timeline) and trace["otherData"]["makespan"] == tl.makespan
