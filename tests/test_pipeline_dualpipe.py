"""DualPipeV as data: FWD_BWD overlapped units in the vocabulary, validator, simulator (cost model
crediting the overlap), text/SVG/CLI, the built-in ScheduleDualPipeV and its lowering for the
runtime. Pure logic, no process group."""
import json
import xml.etree.ElementTree as ET

import pytest

from mindformers_core.pipeline import (
    BUILTIN_SCHEDULES, MetaStep, MetaStepType as T, Schedule1F1B, ScheduleDualPipeV, ScheduleError,
    ScheduleZeroBubbleH1, ScheduleZeroBubbleV, StageInfo, StepCosts, build_schedule, lower_for_runtime,
    render_svg, render_text, simulate, split_overlapped, stages_of_rank, to_chrome_trace, validate_schedule)
from mindformers_core.pipeline.visualize import order_to_json, parse_step, run

SVG = "{http://www.w3.org/2000/svg}"


def F(m, s): return MetaStep(m, T.FWD, s)                      # noqa: E704
def B(m, s): return MetaStep(m, T.BWD, s)                      # noqa: E704
def FB(f, b): return MetaStep.overlapped(f, b)                 # noqa: E704


def dualpipev(p, m, rank=0):
    return ScheduleDualPipeV(stages_of_rank(rank, p, 2, "v"), m)


# --- the step type ------------------------------------------------------------------------------

def test_overlapped_step_holds_both_halves():
    unit = FB(F(3, 1), B(1, 6))
    assert unit.type is T.FWD_BWD and (unit.micro_index, unit.stage_index) == (3, 1)
    assert unit.parts == (F(3, 1), B(1, 6)) and repr(unit) == "F3@s1+B1@s6"
    assert unit == FB(F(3, 1), B(1, 6)) and unit != FB(F(3, 1), B(2, 6))
    assert parse_step("F3@s1+B1@s6") == unit and parse_step("F0@s0+I2@s3").backward.type is T.BWD_INPUT
    assert F(0, 0).parts == (F(0, 0),)
    with pytest.raises(ValueError, match=r"backward=<a BWD or BWD_INPUT MetaStep>, got backward=None"):
        MetaStep(0, T.FWD_BWD, 0)
    with pytest.raises(ValueError, match=r"same microbatch 2 on stage 1"):
        FB(F(2, 1), B(2, 1))
    with pytest.raises(ValueError, match=r"backward=B0@s0 is only for FWD_BWD steps, not FWD"):
        MetaStep(0, T.FWD, 0, B(0, 0))
    with pytest.raises(ValueError, match=r"forward=B0@s0 must be a FWD MetaStep"):
        FB(B(0, 0), B(1, 0))
    with pytest.raises(ValueError, match=r"not an overlapped step"):
        parse_step("F0@s0+W1@s1")


def test_cost_model_credits_the_overlap():
    unit = FB(F(1, 0), B(0, 1))
    assert StepCosts(1, 2).duration(unit) == 3                       # halves one after the other
    assert StepCosts(1, 2, overlap=1.0).duration(unit) == 2          # the shorter half hidden
    assert StepCosts(1, 2, overlap=0.5).duration(unit) == 2.5
    assert StepCosts(1, 2, overlap=1.0).duration(FB(F(1, 0), MetaStep(0, T.BWD_INPUT, 1))) == 1


def test_validator_checks_both_halves_of_a_unit():
    # one stage per rank, two ranks: a unit's halves must each find their inputs before the unit
    good = {0: [F(0, 0), MetaStep(0, T.FWD_SEND, 0), F(1, 0), MetaStep(1, T.FWD_SEND, 0),
                MetaStep(0, T.BWD_RECV, 0), B(0, 0), MetaStep(1, T.BWD_RECV, 0), B(1, 0)],
            1: [MetaStep(0, T.FWD_RECV, 1), F(0, 1), MetaStep(1, T.FWD_RECV, 1), FB(F(1, 1), B(0, 1)),
                MetaStep(0, T.BWD_SEND, 1), B(1, 1), MetaStep(1, T.BWD_SEND, 1)]}
    validate_schedule(good, 2, 2)
    tl = simulate(good)
    unit = next(t for t in tl.steps[1] if t.step.type is T.FWD_BWD)
    assert unit.end - unit.start == 3 and tl.peak_in_flight == {0: 2, 1: 2}
    assert simulate(good, overlap=1.0).makespan == tl.makespan - 1

    bad = {r: list(s) for r, s in good.items()}
    bad[1][0:4] = [MetaStep(0, T.FWD_RECV, 1), MetaStep(1, T.FWD_RECV, 1), FB(F(1, 1), B(0, 1)), F(0, 1)]
    with pytest.raises(ScheduleError, match=r"rank 1, step 2, F1@s1\+B0@s1: needs F0@s1 earlier on rank 1: a "
                                            r"backward comes after its forward \[rule: order\]"):
        validate_schedule(bad, 2, 2)
    dup = {r: list(s) for r, s in good.items()}
    dup[1].append(F(1, 1))
    with pytest.raises(ScheduleError, match=r"F1@s1: appears twice \(first at rank 1 step 3\) \[rule: unique\]"):
        validate_schedule(dup, 2, 2)
    wrong = {r: list(s) for r, s in good.items()}
    wrong[1][3] = FB(F(1, 1), B(0, 0))
    with pytest.raises(ScheduleError, match=r"B0@s0 of the unit: stage 0 lives on rank 0, not on rank 1"):
        validate_schedule(wrong, 2, 2)


# --- ScheduleDualPipeV ---------------------------------------------------------------------------

@pytest.mark.parametrize("p", [2, 4])
def test_dualpipev_validates_for_several_microbatch_counts(p):
    for m in (2 * p, 2 * p + 1, 3 * p, 5 * p):
        sched = dualpipev(p, m)
        assert sched.placement == tuple(list(range(p)) + list(reversed(range(p))))     # the V
        validate_schedule(sched.exec_order, 2 * p, m, "v")
        assert dualpipev(p, m, rank=p - 1).exec_order == sched.exec_order            # same on every rank
        parts = [part for steps in sched.exec_order.values() for s in steps if s.type.is_compute for part in s.parts]
        assert len(parts) == len(set(parts))
        for s in range(2 * p):
            for i in range(m):
                assert F(i, s) in parts
                assert (B(i, s) in parts) != (MetaStep(i, T.BWD_INPUT, s) in parts and
                                              MetaStep(i, T.BWD_WEIGHT, s) in parts)
        for r, steps in sched.exec_order.items():
            units = [s for s in steps if s.type is T.FWD_BWD]
            # steady state: two units per round (the last rank runs its first pair apart), then p-1-r more
            assert len(units) == 2 * (m - 2 * p + r + 1) - (r == p - 1) + (p - 1 - r)
            # a unit overlaps one chunk's forward with the other chunk's backward
            assert all({u.stage_index, u.backward.stage_index} == {r, 2 * p - 1 - r} for u in units)
        # every chunk runs its forwards and backwards in microbatch order (jit dropout replay)
        for r, steps in sched.exec_order.items():
            for s in (r, 2 * p - 1 - r):
                for kinds in ((T.FWD,), (T.BWD, T.BWD_INPUT)):
                    seq = [q.micro_index for st in steps for q in st.parts if q.stage_index == s and q.type in kinds]
                    assert seq == list(range(m))


@pytest.mark.parametrize("p, m", [(2, 4), (2, 8), (4, 8), (4, 16), (4, 32)])
def test_dualpipev_bubble_against_1f1b_zb_h1_and_zbv(p, m):
    """Same work per rank in both scales: one-stage-per-rank schedules with F=2, B=4 (a rank's
    layers), V schedules with F=1, B=2 per half. Without overlap DualPipeV costs what ZB-H1 costs;
    crediting the overlap it is the shortest."""
    one = simulate(Schedule1F1B(StageInfo(0, p), m), fwd_time=2, bwd_time=4)
    zbh1 = simulate(ScheduleZeroBubbleH1(StageInfo(0, p), m), fwd_time=2, bwd_time=4)
    zbv = simulate(ScheduleZeroBubbleV(stages_of_rank(0, p, 2, "v"), m))
    sched = dualpipev(p, m)
    seq, full = simulate(sched), simulate(sched, overlap=1.0)
    assert seq.makespan == zbh1.makespan < one.makespan
    assert seq.bubble_ratio == pytest.approx(zbh1.bubble_ratio)
    assert full.makespan < zbv.makespan <= seq.makespan
    # activations: 2p + 1 half-rank stage activations on every rank (DeepSeek: PP + 1 for PP = 2p)
    assert seq.peak_until_weight_grad == {r: 2 * p + 1 for r in range(p)}
    assert max(seq.peak_in_flight.values()) == 2 * p + 1


def test_dualpipev_arguments():
    with pytest.raises(ValueError, match=r"ScheduleDualPipeV: micro_batch_num=7 must be >= 2 \* pp_size = 8 "
                                         r"\(pp_size=4\); use 8 or more, or ScheduleZeroBubbleV"):
        dualpipev(4, 7)
    with pytest.raises(ValueError, match=r"got 1 stage\(s\) for this rank; DualPipeV needs exactly 2"):
        ScheduleDualPipeV([StageInfo(0, 4)], 8)
    assert BUILTIN_SCHEDULES["dualpipev"] == (ScheduleDualPipeV, 2, "v")
    sched = build_schedule("dualpipev", stages_of_rank(1, 2, 2, "v"), 4)
    assert isinstance(sched, ScheduleDualPipeV) and sched.rank == 1


@pytest.mark.parametrize("p, m", [(2, 4), (4, 9)])
def test_local_order_is_the_lowering_the_runtime_executes(p, m):
    sched = dualpipev(p, m)
    lowered = lower_for_runtime(sched)
    assert lowered == split_overlapped(sched.exec_order)            # units split in place, comm kept
    for rank in range(p):
        local = dualpipev(p, m, rank=rank).local_order
        assert local == lowered[rank]
        assert not any(s.type is T.FWD_BWD for s in local)
    validate_schedule(lowered, 2 * p, m, "v")                       # blocking send/recv, single steps
    assert simulate(lowered).makespan == simulate(sched).makespan   # same numbers without overlap credit
    # an order with nothing to lower comes back as it is
    one = Schedule1F1B(StageInfo(0, 4), 8)
    assert lower_for_runtime(one) == one.exec_order and one.local_order is one.exec_order[0]


# --- drawing ------------------------------------------------------------------------------------

def test_text_chart_svg_and_chrome_trace_show_units():
    sched = dualpipev(2, 4)
    chart = render_text(sched)
    assert "F3@s0+B1@s3" in chart.splitlines()[1]
    root = ET.fromstring(render_svg(sched))
    boxes = [r for r in root.iter(SVG + "rect") if "step" in r.get("class", "").split()]
    units = [r for r in boxes if "step-FB" in r.get("class")]
    assert sorted(r.get("data-step") for r in units) == sorted(
        repr(s) for steps in sched.exec_order.values() for s in steps if s.type is T.FWD_BWD)
    assert len([r for r in root.iter(SVG + "rect") if r.get("class") == "fb-backward"]) == len(units)
    assert any(t.text == "3|1" for t in root.iter(SVG + "text"))        # forward 3 with backward 1
    events = [e for e in json.loads(json.dumps(to_chrome_trace(sched)))["traceEvents"] if e["ph"] == "X"]
    assert {e["args"]["type"] for e in events} >= {"FWD_BWD", "FWD", "BWD", "BWD_INPUT", "BWD_WEIGHT"}


def test_cli_draws_dualpipev_and_reads_its_order_back(tmp_path, capsys):
    dumped = tmp_path / "dpv.json"
    assert run(["--schedule", "dualpipev", "--stages", "2", "--microbatches", "4", "--overlap", "1",
                "--dump-order", str(dumped)]) == 0
    first = capsys.readouterr().out
    assert "makespan 22, bubble" in first
    data = json.loads(dumped.read_text())
    assert any("+" in s for s in data["exec_order"]["0"])
    assert run(["--order", str(dumped), "--overlap", "1"]) == 0
    assert capsys.readouterr().out.splitlines()[1:] == first.splitlines()[1:]
    sched = dualpipev(2, 4)
    posted = order_to_json(lower_for_runtime(sched), 4, 4, sched.placement)
    (tmp_path / "low.json").write_text(json.dumps(posted))
    assert run(["--order", str(tmp_path / "low.json"), "--async-send"]) == 0


def test_trace_files_keep_units(tmp_path):
    from mindformers_core.pipeline import load_trace, save_trace
    tl = simulate(dualpipev(2, 4))
    files = [save_trace(str(tmp_path / f"r{r}.json"), [(t.step, t.start, t.end) for t in ts], rank=r)
             for r, ts in tl.steps.items()]
    back = load_trace(*files, scale=1.0)
    assert {r: [t.step for t in ts] for r, ts in back.steps.items()} == {r: [t.step for t in ts] for r, ts in tl.steps.items()}
    assert back.makespan == tl.makespan and back.peak_in_flight == tl.peak_in_flight
