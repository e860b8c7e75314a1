"""The bidirectional DualPipe (DeepSeek-V3) as MetaSteps: its compute order (``dualpipe_compute_order``),
the two routes (down copy on stages 0..p-1, up copy on p..2p-1, V placement), the validator of that order,
and its predicted bubble and memory against 1F1B, ZB-H1, ZBV and DualPipeV with free communication.

``python -m tests.test_pipeline_dualpipe_bidirectional`` prints the table docs/pipeline.md holds."""
import pytest

from mindformers_core.pipeline import (Schedule1F1B, ScheduleDualPipeV, ScheduleZeroBubbleH1, ScheduleZeroBubbleV,
                                       compute_only)
from mindformers_core.pipeline.compute_order import ideal_makespan
from mindformers_core.pipeline.costs import StepCosts
from mindformers_core.pipeline.dualpipe import (dualpipe_compute_order, dualpipe_placement, dualpipe_routes,
                                                simulate_dualpipe, validate_dualpipe_order)
from mindformers_core.pipeline.errors import ScheduleError
from mindformers_core.pipeline.meta_step import MetaStep, MetaStepType as T
from mindformers_core.pipeline.stage import StageInfo, stages_of_rank

SIZES = [(2, 4), (2, 8), (4, 8), (4, 16), (4, 32), (8, 16), (8, 32)]


@pytest.mark.parametrize("p, m", [(2, 4), (2, 6), (2, 8), (4, 8), (4, 10), (4, 16)])
@pytest.mark.parametrize("overlap", [True, False])
def test_dualpipe_order_validates_and_keeps_each_direction_on_its_copy(p, m, overlap):
    order = dualpipe_compute_order(p, m, overlap)
    validate_dualpipe_order(order, p, m)
    assert dualpipe_placement(p) == tuple(range(p)) + tuple(range(p - 1, -1, -1))
    half = m // 2
    for r, steps in order.items():
        parts = [q for st in steps for q in st.parts]
        # rank r holds model stage r of the down copy and model stage p-1-r of the up copy (index 2p-1-r)
        assert {q.stage_index for q in parts} == {r, 2 * p - 1 - r}
        for q in parts:
            assert (q.micro_index < half) == (q.stage_index < p)
        # every copy runs its forwards and its backwards in microbatch order
        for s in (r, 2 * p - 1 - r):
            for kinds in ((T.FWD,), (T.BWD, T.BWD_INPUT)):
                seq = [q.micro_index for q in parts if q.stage_index == s and q.type in kinds]
                first = 0 if s < p else half
                assert seq == list(range(first, first + half))
        units = [st for st in steps if st.type is T.FWD_BWD]
        assert bool(units) == overlap and p >= 2
        # a unit overlaps the forward of one direction with the backward of the other
        assert all({u.stage_index, u.backward.stage_index} == {r, 2 * p - 1 - r} for u in units)
    # mirror ranks run the same pattern, each with its own direction as chunk 0
    for r in range(p // 2):
        kinds = [[(st.type, st.stage_index < p) for st in order[x]] for x in (r, p - 1 - r)]
        assert [k for k, _ in kinds[0]] == [k for k, _ in kinds[1]]
        assert [d for _, d in kinds[0]] == [not d for _, d in kinds[1]]


def test_dualpipe_bubble_is_the_papers_formula():
    """DeepSeek-V3 report, Table 2: DualPipe's bubble is (PP/2 - 1)(F&B + B - 3W) per rank, with
    activations PP + 1 per rank (here in stages of one microbatch) -- with free communication and
    ``overlap`` 0 (F&B = F + B) and 1 (F&B = max(F, B))."""
    F, B, W = 2.0, 4.0, 2.0
    for p, m in SIZES:
        for overlap, fb in ((0.0, F + B), (1.0, max(F, B))):
            sim = simulate_dualpipe(p, m, F, B, overlap=overlap)
            idle = {r: round(b * sim.makespan, 9) for r, b in sim.bubble_per_rank.items()}
            # the formula is the middle ranks' idle time; without overlap every rank idles that long,
            # with it the ranks nearer the ends idle less (they run fewer overlapped units)
            assert max(idle.values()) == (p // 2 - 1) * (fb + B - 3 * W), (p, m, overlap, idle)
            if overlap == 0.0:
                assert len(set(idle.values())) == 1
            assert sim.peak_until_weight_grad == {r: p + 1 for r in range(p)}


def test_validator_names_broken_dualpipe_orders():
    p, m = 4, 8
    good = dualpipe_compute_order(p, m, overlap=False)

    def broken(edit):
        order = {r: list(steps) for r, steps in good.items()}
        edit(order)
        with pytest.raises(ScheduleError) as e:
            validate_dualpipe_order(order, p, m)
        return e.value

    # a down microbatch on an up stage of the same rank
    def off_route(o):
        o[0][0] = MetaStep(0, T.FWD, 7)
    err = broken(off_route)
    assert err.rule == "placement" and "runs the down copy, stages 0..3, not stage 7" in str(err)
    err = broken(lambda o: o[1].__setitem__(0, MetaStep(0, T.FWD, 2)))
    assert err.rule == "placement" and "lives on rank 2, not on rank 1" in str(err)
    err = broken(lambda o: o[0].pop(0))
    assert err.rule == "complete"

    def backward_first(o):                 # rank 3's first backward moved before its forward
        i = next(i for i, st in enumerate(o[3]) if st.type in (T.BWD, T.BWD_INPUT))
        o[3].insert(0, o[3].pop(i))
    assert broken(backward_first).rule == "order"

    def cycle(o):                          # rank 0 waits for the up copy's first gradient before any forward
        i = next(i for i, st in enumerate(o[0]) if st.stage_index == 2 * p - 1 and st.type in (T.BWD, T.BWD_INPUT))
        f = next(i for i, st in enumerate(o[0]) if st.stage_index == 2 * p - 1 and st.type is T.FWD)
        o[0].insert(0, o[0].pop(f))
        o[0].insert(1, o[0].pop(i))
        o[0][2:] = [st for st in o[0][2:] if st != o[0][0]]
    err = broken(cycle)
    assert err.rule in ("dataflow", "order")
    for bad in ((3, 8), (4, 6), (4, 9), (0, 4)):
        with pytest.raises(ScheduleError) as e:
            dualpipe_compute_order(*bad)
        assert e.value.rule == "input"
    assert list(dualpipe_routes(2, 4).values()) == [range(0, 2), range(0, 2), range(2, 4), range(2, 4)]


def test_visualizer_draws_the_dualpipe_timeline():
    """``simulate_dualpipe`` returns a simulator Timeline: the text chart, SVG and Chrome trace draw it,
    each rank showing its two stages (the down copy's s<r>, the up copy's s<2p-1-r>) and the units."""
    from mindformers_core.pipeline import render_svg, render_text, to_chrome_trace
    tl = simulate_dualpipe(4, 8, overlap=1.0)
    text = render_text(tl)
    rows = [line for line in text.splitlines() if line.startswith("rank ")]
    assert len(rows) == 4 and "@s0" in rows[0] and "@s7" in rows[0] and "@s3" in rows[3] and "@s4" in rows[3]
    assert "makespan 44" in text
    assert render_svg(tl).startswith("<svg") and "F4" in render_svg(tl)
    events = to_chrome_trace(tl)["traceEvents"] if isinstance(to_chrome_trace(tl), dict) else to_chrome_trace(tl)
    assert len([e for e in events if e.get("ph") == "X"]) == sum(len(v) for v in tl.steps.values())


def bubble_rows(sizes=SIZES):
    """Makespan / bubble ratio with free communication (``ideal_makespan``: what posted point-to-point with
    hidden transfers reaches) and the same work per rank in every column: one-stage schedules and DualPipe
    F=2, B=4 per stage (DualPipe's stages are whole stages of a p-stage model, each rank runs two of them
    on half the microbatches each), V schedules F=1, B=2 per half stage; I = W = B/2."""
    rows = []
    for p, m in sizes:
        work = m * 6.0

        def cell(makespan):
            return f"{makespan:g} / {1 - work / makespan:.3f}"
        full = StepCosts(2.0, 4.0)
        half = StepCosts(1.0, 2.0)
        one = ideal_makespan(compute_only(Schedule1F1B(StageInfo(0, p), m).exec_order), p, full)
        zbh1 = ideal_makespan(compute_only(ScheduleZeroBubbleH1(StageInfo(0, p), m).exec_order), p, full)
        zbv = ideal_makespan(compute_only(ScheduleZeroBubbleV(stages_of_rank(0, p, 2, "v"), m).exec_order), 2 * p, half)
        dpv = ScheduleDualPipeV(stages_of_rank(0, p, 2, "v"), m).exec_order
        dpv0 = ideal_makespan(compute_only(dpv), 2 * p, half)
        dpv1 = ideal_makespan(compute_only(dpv), 2 * p, StepCosts(1.0, 2.0, overlap=1.0))
        dp0, dp1 = (simulate_dualpipe(p, m, 2.0, 4.0, overlap=o) for o in (0.0, 1.0))
        rows.append([p, m, cell(one), cell(zbh1), cell(zbv), cell(dpv0), f"{dpv1:g}", cell(dp0.makespan),
                     f"{dp1.makespan:g}", f"{max(dp0.peak_until_weight_grad.values())}"])
    return rows


def bubble_table(sizes=SIZES) -> str:
    head = ["p", "m", "1F1B", "ZB-H1", "ZBV", "DualPipeV 0", "DualPipeV 1 (makespan)", "DualPipe 0",
            "DualPipe 1 (makespan)", "DualPipe peak (stages)"]
    lines = ["| " + " | ".join(head) + " |", "| " + " | ".join("---" for _ in head) + " |"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in bubble_rows(sizes)]
    return "\n".join(lines)


def test_docs_hold_the_generated_bubble_table():
    import os
    with open(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "pipeline.md")) as f:
        assert bubble_table() in f.read()
    # what the table says, held: DualPipe on p ranks costs what DualPipeV costs on p/2 ranks with m/2
    # microbatches (its rank runs DualPipeV's rank pattern on whole stages), and without overlap it beats ZB-H1
    for p, m in SIZES:
        dp = simulate_dualpipe(p, m, 2.0, 4.0).makespan
        if p > 2:
            half = ScheduleDualPipeV(stages_of_rank(0, p // 2, 2, "v"), m // 2).exec_order
            assert dp == 2 * ideal_makespan(compute_only(half), p, StepCosts(1.0, 2.0))
        zbh1 = ideal_makespan(compute_only(ScheduleZeroBubbleH1(StageInfo(0, p), m).exec_order), p, StepCosts(2.0, 4.0))
        assert dp < zbh1
        # with full overlap: DualPipeV's makespan on p ranks
        dpv = ScheduleDualPipeV(stages_of_rank(0, p, 2, "v"), m).exec_order
        assert simulate_dualpipe(p, m, 2.0, 4.0, overlap=1.0).makespan == \
            ideal_makespan(compute_only(dpv), 2 * p, StepCosts(1.0, 2.0, overlap=1.0))


if __name__ == "__main__":
    print(bubble_table())
