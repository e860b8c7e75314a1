"""The visualize command (text chart, per-rank summary, SVG, exit status 2 naming rank and step for a
broken order), the SVG picture, and measured traces saved by the runtime and drawn back."""
import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

from mindformers_core import pipeline as pp
from mindformers_core.pipeline.visualize import order_to_json, parse_step, run, schedule_from_name

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SVG = "{http://www.w3.org/2000/svg}"


def cli(*args, timeout=120):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "mindformers_core.pipeline.visualize", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def boxes(path):
    root = ET.parse(path).getroot()
    assert root.tag == SVG + "svg"
    return [r for r in root.iter(SVG + "rect") if "step" in r.get("class", "").split()]


def compute_steps(sched):
    return sorted(repr(s) for steps in sched.exec_order.values() for s in steps if s.type.is_compute)


@pytest.mark.parametrize("name, extra", [("1f1b", []), ("zbv", ["--bwd-input", "1", "--bwd-weight", "1"])])
def test_cli_prints_chart_and_writes_svg(tmp_path, name, extra):
    svg = tmp_path / f"{name}.svg"
    res = cli("--schedule", name, "--stages", "4", "--microbatches", "8", *extra, "--svg", str(svg))
    assert res.returncode == 0, res.stderr
    sched = schedule_from_name(name, 4, 8)
    tl = pp.simulate(sched)
    lines = res.stdout.splitlines()
    assert [line.split("|")[0].strip() for line in lines if "|" in line][1:] == [f"rank {r}" for r in range(4)]
    assert f"makespan {tl.makespan:g}, bubble {tl.bubble_ratio:.1%}" in res.stdout
    table = [line.split() for line in lines if line.split()[:1] in ([str(r)] for r in range(4))]
    assert [row[2] for row in table] == [f"{tl.bubble_per_rank[r]:.1%}" for r in range(4)]    # bubble per rank
    assert [int(row[3]) for row in table] == [tl.peak_in_flight[r] for r in range(4)]          # peak in flight
    found = boxes(svg)
    assert sorted(r.get("data-step") for r in found) == compute_steps(sched)       # one box per compute step
    assert {r.get("class").split()[1] for r in found} == ({"step-F", "step-B"} if name == "1f1b"
                                                          else {"step-F", "step-I", "step-W"})
    f0 = next(r for r in found if r.get("data-step") == "F0@s0")
    assert float(f0.get("width")) > 10                                             # readable, not a sliver


def test_cli_broken_order_exits_2_naming_rank_and_step(tmp_path):
    sched = pp.Schedule1F1B(pp.StageInfo(0, 2), 2)
    data = order_to_json(sched.exec_order, sched.stage_num, sched.micro_batch_num, sched.placement)
    rank1 = data["exec_order"]["1"]
    assert rank1[:2] == ["RECV_F0@s1", "F0@s1"]
    rank1[0], rank1[1] = rank1[1], rank1[0]                  # compute before its input arrived
    path = tmp_path / "broken.json"
    path.write_text(json.dumps(data))
    res = cli("--order", str(path))
    assert res.returncode == 2
    assert "rank 1, step 0, F0@s1: needs RECV_F0@s1 earlier on rank 1" in res.stderr
    assert "[rule: order]" in res.stderr and "->   0 F0@s1" in res.stderr   # the rank's list, failing step marked
    assert res.stdout == ""


def test_custom_schedule_class_and_order_file(tmp_path, monkeypatch, capsys):
    (tmp_path / "my_sched.py").write_text(          # the design's GPipe with the receive after the forward
        "from mindformers_core.pipeline import MetaStep, MetaStepType as T, PipelineScheduleSingle\n"
        "class Broken(PipelineScheduleSingle):\n"
        "    def construct_exec_order(self):\n"
        "        n, m = self.stage.stage_num, self.micro_batch_num\n"
        "        for s in range(n):\n"
        "            order = []\n"
        "            for i in range(m):\n"
        "                order.append(MetaStep(i, T.FWD, s))\n"
        "                if s: order.append(MetaStep(i, T.FWD_RECV, s))\n"
        "                if s < n - 1: order.append(MetaStep(i, T.FWD_SEND, s))\n"
        "            for i in range(m):\n"
        "                if s < n - 1: order.append(MetaStep(i, T.BWD_RECV, s))\n"
        "                order.append(MetaStep(i, T.BWD, s))\n"
        "                if s: order.append(MetaStep(i, T.BWD_SEND, s))\n"
        "            self.exec_order[s] = order\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert run(["--schedule", "my_sched:Broken", "--stages", "2", "--microbatches", "1"]) == 2
    err = capsys.readouterr().err
    assert "invalid schedule: rank 1, step 0, F0@s1: needs RECV_F0@s1 earlier on rank 1" in err
    assert "rank 1's order around step 0:" in err and "->   0 F0@s1" in err
    # a valid order file round-trips through --dump-order / --order with the same chart
    dumped = tmp_path / "order.json"
    assert run(["--schedule", "interleaved", "--stages", "2", "--microbatches", "4", "--dump-order", str(dumped)]) == 0
    first = capsys.readouterr().out
    assert run(["--order", str(dumped)]) == 0
    second = capsys.readouterr().out
    assert first.splitlines()[1:] == second.splitlines()[1:]
    assert parse_step("HANDOFF_B3@s4") == pp.MetaStep(3, pp.MetaStepType.BWD_HANDOFF, 4)
    with pytest.raises(ValueError, match="'X3@s1' is not a step"):
        parse_step("X3@s1")


@pytest.mark.parametrize("argv, message", [
    (["--schedule", "1f1b", "--stages", "4", "--microbatches", "8", "--virtual", "2"],
     "--virtual 2: schedule '1f1b' needs 1 stages per rank"),
    (["--schedule", "dualpipev", "--stages", "4", "--microbatches", "6"], "must be >= 2 * pp_size = 8"),
    (["--schedule", "nope", "--stages", "2", "--microbatches", "2"], "give a built-in name"),
    (["--schedule", "1f1b", "--stages", "2"], "--stages and --microbatches are required"),
    (["--schedule", "1f1b", "--stages", "2", "--microbatches", "2", "--fwd", "0"], "fwd_time=0.0 must be"),
])
def test_usage_errors_exit_2(argv, message, capsys):
    assert run(argv) == 2
    assert message in capsys.readouterr().err


def test_measured_trace_from_the_runtime_round_trips(tmp_path, capsys):
    """A real (one-process) runtime records its steps; the saved trace loads back as a Timeline,
    merges with other ranks' files, and the command draws it next to the simulated prediction."""
    import numpy as np
    from mindspore import Tensor, nn
    from mindformers_core.pipeline.runtime import PipelineStage

    def mse(out, y):
        return ((out - y) ** 2).mean()
    stage = PipelineStage(nn.Dense(8, 8), 0, 1, loss_fn=mse)
    sched = pp.Schedule1F1B(stage, 2)
    runtime = sched.runtime()
    runtime.record = True
    x = Tensor(np.ones((4, 8), np.float32))
    for _ in range(2):                                           # two recorded iterations
        sched.run(x, x)
    own = tmp_path / "rank0.json"
    pp.save_trace(str(own), runtime)
    data = json.loads(own.read_text())
    assert data["schedule"] == {"name": "Schedule1F1B", "stage_num": 1, "micro_batch_num": 2, "placement": [0]}
    assert [row[:3] for row in data["ranks"]["0"][:4]] == [["FWD", 0, 0], ["BWD", 0, 0], ["FWD", 1, 0], ["BWD", 1, 0]]
    tl = pp.load_trace(str(own))                                  # the last iteration, in ms from 0
    assert [repr(t.step) for t in tl.steps[0]] == ["F0@s0", "B0@s0", "F1@s0", "B1@s0"]
    assert tl.steps[0][0].start == 0 and tl.makespan > 0
    first = pp.load_trace(str(own), iteration=0)
    assert first.steps[0][0].start == 0
    with pytest.raises(ValueError, match="iteration=5 but rank 0 recorded 2 iteration"):
        pp.load_trace(str(own), iteration=5)

    # two ranks in separate files: a simulated 2-rank 1F1B turned into seconds, twice
    two = pp.Schedule1F1B(pp.StageInfo(0, 2), 4)
    sim = pp.simulate(two, fwd_time=0.01, bwd_time=0.02)
    files = []
    for rank, ts in sim.steps.items():
        trace = [(t.step, 100 + t.start, 100 + t.end) for t in ts] + [(t.step, 200 + t.start, 200 + t.end) for t in ts]
        files.append(pp.save_trace(str(tmp_path / f"r{rank}.json"), trace, rank=rank))
    merged = pp.load_trace(*files)
    assert merged.makespan == pytest.approx(sim.makespan * 1e3)
    assert merged.bubble_ratio == pytest.approx(sim.bubble_ratio)
    assert merged.peak_in_flight == sim.peak_in_flight
    svg = tmp_path / "measured.svg"
    assert run(["--trace", *files, "--schedule", "1f1b", "--stages", "2", "--microbatches", "4",
                "--svg", str(svg)]) == 0
    out = capsys.readouterr().out
    assert "measured timeline" in out and "simulated with the measured mean step costs" in out
    assert f"bubble {sim.bubble_ratio:.1%} (measured {sim.bubble_ratio:.1%})" in out
    assert len(boxes(svg)) == 16
    with pytest.raises(ValueError, match="rank 0 appears in two trace files"):
        pp.load_trace(files[0], files[0])
    (tmp_path / "bad.json").write_text("{}")
    assert run(["--trace", str(tmp_path / "bad.json")]) == 2
    assert "is not a pipeline trace" in capsys.readouterr().err


def test_svg_marks_virtual_stages_and_escapes_title():
    sched = pp.ScheduleInterleaved1F1B(pp.stages_of_rank(0, 2, 2), 2)
    text = pp.render_svg(sched, title="a < b & c")
    root = ET.fromstring(text)
    found = [r for r in root.iter(SVG + "rect") if "step" in r.get("class", "").split()]
    assert sorted(r.get("data-step") for r in found) == compute_steps(sched)
    later = {r.get("fill-opacity") for r in found if int(r.get("data-step").split("@s")[1]) >= 2}
    assert later == {"0.7"}                                         # the rank's second stage is lighter
    assert any(t.text == "a < b & c" for t in root.iter(SVG + "text"))
