"""Monitoring as MindFormers users know it: TensorBoard event files (read back with the ``tensorboard``
package's own EventAccumulator) equal to loss.jsonl, and the loss-curve SVG next to loss.jsonl.
Runs go through run_mindformer.py's ``cli.main`` on the tiny model of tests/test_trainer.py, 3 steps."""
import json
import os
import xml.etree.ElementTree as ET

import pytest

from mindformers_core.training import cli
from mindformers_core.training.monitoring import SCALAR_TAGS, loss_svg, write_loss_svg

STEPS = 3
SVG = "{http://www.w3.org/2000/svg}"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from tests.test_trainer import build_assets
    return build_assets(str(tmp_path_factory.getbasetemp() / "trainer_assets"))


def run(capsys, *argv):
    capsys.readouterr()
    code = cli.main([str(a) for a in argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def records(out):
    with open(os.path.join(str(out), "loss.jsonl")) as f:
        return [json.loads(line) for line in f]


def scalars(directory):
    """{tag: [(step, value)]} of the event files in ``directory``, read by TensorBoard's own reader."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    acc = EventAccumulator(str(directory), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def check_curve(svg_path, recs):
    """The SVG parses as XML and its loss polyline holds every step's (step, loss)."""
    root = ET.parse(svg_path).getroot()
    assert root.tag == f"{SVG}svg"
    line = root.find(f".//{SVG}polyline[@id='loss']")
    points = [p.split(",") for p in line.get("points").split()]
    assert len(points) == len(recs)
    data = [tuple(x.split(":")) for x in line.get("data-steps-losses").split()]
    assert [(int(s), float(v)) for s, v in data] == [(r["step"], r["loss"]) for r in recs]
    xs = [float(x) for x, _ in points]
    assert xs == sorted(xs) and len(set(xs)) == len(xs)


def test_graph_mode_tensorboard_block_writes_what_loss_jsonl_holds(tiny, tmp_path, capsys):
    out, tb = tmp_path / "out", tmp_path / "tb"
    code, stdout, err = run(capsys, "--config", tiny["yaml"], "--output_dir", out, "--runner_config.max_steps",
                            STEPS, "--tensorboard.tensorboard_dir", tb,
                            "--tensorboard.log_timers_to_tensorboard", True)
    assert code == 0, err
    recs = records(out)
    got = scalars(tb)
    assert {"loss", "learning-rate", "grad-norm", "throughput", "iteration-time"} <= set(got)
    for field, tag in (("loss", "loss"), ("lr", "learning-rate"), ("grad_norm", "grad-norm"),
                       ("tokens_per_s", "throughput"), ("step_time_s", "iteration-time")):
        assert [s for s, _ in got[tag]] == [r["step"] for r in recs]
        assert [v for _, v in got[tag]] == pytest.approx([r[field] for r in recs], rel=1e-6)   # float32 events
    svg = out / "loss.svg"
    assert f"loss curve: {svg}" in stdout and f"tensorboard --logdir {tb}" in stdout
    check_curve(svg, recs)


def test_pynative_monitor_tensorboard_with_interval_and_moe_load(tiny, tmp_path, capsys):
    """MindFormers' PyNative keys (monitor.tensorboard.output_dir / log_interval / queue_size) on a tiny
    MoE model: every 2nd step, with load-balancing loss and per-expert load."""
    import yaml
    raw = {"training": {"steps": 4, "local_batch_size": 4, "seed": 0},
           "model": {"architectures": "LlamaForCausalLM", "num_hidden_layers": 2, "hidden_size": 64,
                     "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128,
                     "vocab_size": 384, "seq_length": 32, "num_experts": 4, "num_experts_per_tok": 2,
                     "moe_intermediate_size": 32, "moe_aux_loss_coeff": 0.01},
           "train_dataset": {"dataloader": {"type": "text", "dataset_dir": tiny["corpus"]},
                             "tokenizer_file": tiny["tokenizer"]},
           "monitor": {"tensorboard": {"output_dir": str(tmp_path / "tb"), "log_interval": 2, "queue_size": 5}},
           "output_dir": str(tmp_path / "out")}
    path = tmp_path / "moe.yaml"
    path.write_text(yaml.safe_dump(raw))
    code, stdout, err = run(capsys, "--config", path)
    assert code == 0, err
    recs = [r for r in records(tmp_path / "out") if r["step"] % 2 == 0]
    got = scalars(tmp_path / "tb")
    assert [s for s, _ in got["loss"]] == [2, 4]
    assert [v for _, v in got["loss"]] == pytest.approx([r["loss"] for r in recs], rel=1e-6)
    assert [v for _, v in got["load-balancing-loss"]] == pytest.approx([r["aux_loss"] for r in recs], rel=1e-6)
    for layer in range(2):
        for e in range(4):
            values = [v for _, v in got[f"expert-load/layer_{layer}/ep_{e}"]]
            assert values == pytest.approx([r["expert_load"][layer][e] for r in recs], rel=1e-6)
    assert "monitor.tensorboard" not in stdout            # applied: not in the "not applied on CPU" summary


def test_loss_svg_marks_eval_points_and_skips_null_losses(tmp_path):
    log = tmp_path / "loss.jsonl"
    recs = [{"step": 1, "loss": 6.0}, {"step": 2, "loss": None}, {"step": 3, "loss": 5.5, "eval_loss": 5.7},
            {"step": 4, "loss": 5.0}]
    log.write_text("".join(json.dumps(r) + "\n" for r in recs))
    svg = write_loss_svg(str(log))
    assert svg == str(tmp_path / "loss.svg")
    root = ET.parse(svg).getroot()
    line = root.find(f".//{SVG}polyline[@id='loss']")
    assert len(line.get("points").split()) == 3                         # the null loss (NaN step) left out
    dots = root.findall(f".//{SVG}g[@id='eval_loss']/{SVG}circle")
    assert [(d.get("data-step"), d.get("data-loss")) for d in dots] == [("3", "5.7")]
    assert write_loss_svg(str(tmp_path / "missing.jsonl")) is None
    ET.fromstring(loss_svg([1], [2.0]))                                 # one point: still a valid picture
    assert set(SCALAR_TAGS) >= {"loss", "lr", "grad_norm", "tokens_per_s"}
