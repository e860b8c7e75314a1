"""The feature grid's table and its pure parts (mindformers_core/testing/grid.py): the cells it generates, the YAML
of a cell and of its reference, the filter, the preflight's refusals found before any worker, the comparison and
the markdown table. The cells themselves run in tests/test_grid_msrun.py (a subset) and scripts/check_grid.py."""
import json
import os

import numpy as np
import pytest
import yaml

from mindformers_core.testing import grid

SCRIPTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts")


def test_the_table_generates_every_cell_once():
    """2 features x 3 models x 2 data x 2 modes x the layouts (ep2 for the two mixtures of experts only)."""
    all_cells = grid.cells()
    assert len(all_cells) == 2 * 2 * 2 * (7 + 8 + 8) == 184
    assert len({c.name for c in all_cells}) == len(all_cells)
    assert not [c for c in all_cells if c.layout == "ep2" and c.model == "qwen3"]
    # Qwen3-MoE's aux_loss (over the batch) is per microbatch under a pipeline: its pp cells' references take it
    # over the layout's micro_batch_num row groups (one_mb2: 1F1B, one_mb4: DualPipeV)
    ones = {f"{f}-{m}-{d}-{one}-{mode}" for f in grid.FEATURES for m in grid.MODELS for d in grid.DATA
            for mode in grid.MODES for one in (("one", "one_mb2", "one_mb4") if m == "qwen3_moe" else ("one",))}
    assert {c.reference for c in all_cells} == ones
    cell = grid.Cell("full", "qwen3_moe", "plain", "pp2_dualpipev", "jit")
    mc = grid.config_of(cell, "/w", layout="one")["model"]["model_config"]
    assert mc["moe_aux_loss_micro_batches"] == 4 and cell.reference == "full-qwen3_moe-plain-one_mb4-jit"
    assert "moe_aux_loss_micro_batches" not in grid.config_of(grid.Cell("full", "deepseek_v3", "plain",
                                                                        "pp2_1f1b", "jit"), "/w", layout="one")[
        "model"]["model_config"]


def test_filter():
    only = grid.parse_only("model=qwen3,mode=jit,layout=dp2|cp2_ring")
    assert only == {"model": ["qwen3"], "mode": ["jit"], "layout": ["dp2", "cp2_ring"]}
    got = grid.cells(only)
    assert len(got) == 2 * 2 * 2 and {c.layout for c in got} == {"dp2", "cp2_ring"}
    with pytest.raises(ValueError, match="valid keys are"):
        grid.cells({"modle": ["qwen3"]})
    with pytest.raises(ValueError, match=r"\['qwen4'\] not in"):
        grid.cells({"model": ["qwen4"]})
    with pytest.raises(ValueError, match="not key=value"):
        grid.parse_only("qwen3")


def test_a_cell_and_its_reference_differ_only_in_the_parallel_keys(tmp_path):
    cell = grid.Cell("lora", "deepseek_v3", "packed", "pp2_1f1b", "jit")
    raw, ref = grid.config_of(cell, str(tmp_path)), grid.config_of(cell, str(tmp_path), layout="one")
    assert raw["use_parallel"] is True and ref["use_parallel"] is False
    assert raw["parallel_config"]["pipeline_stage"] == 2 and ref["parallel_config"]["pipeline_stage"] == 1
    assert raw["runner_config"]["batch_size"] * raw["parallel_config"]["micro_batch_num"] == grid.GLOBAL_BATCH
    assert ref["runner_config"]["batch_size"] == grid.GLOBAL_BATCH
    assert raw["model"]["model_config"]["offset"] == [1, 0] and "offset" not in ref["model"]["model_config"]
    assert raw["context"]["mode"] == ref["context"]["mode"] == 0
    for r in (raw, ref):
        mc = r["model"]["model_config"]
        assert mc["pet_config"]["target_modules"] == grid.MODELS["deepseek_v3"].values["lora_targets"]
        assert mc["mtp_depth"] == 1 and mc["seq_length"] == 256
        assert r["train_dataset"]["data_loader"]["path"].endswith(os.path.join("sft", "alpaca_arith.json"))
        # LoRA freezes the base: the folder with the MTP layer DeepSeek's checkpoints hold (made by prepare())
        assert r["pretrained_model_dir"] == r["load_checkpoint"] == str(tmp_path / "hf" / "deepseek_v3_with_mtp_layer")
    full = grid.Cell("full", "deepseek_v3", "packed", "pp2_1f1b", "jit")
    assert grid.config_of(full, str(tmp_path))["load_checkpoint"] == os.path.join(grid.FIXTURES, "hf", "deepseek_v3")
    plain = grid.config_of(grid.Cell("full", "qwen3", "plain", "dp2", "pynative"), str(tmp_path))
    assert plain["train_dataset"] == {"type": "text", "dataset_dir": str(tmp_path / "corpus.txt"), "shuffle": False}
    assert "pet_config" not in plain["model"]["model_config"] and "offset" not in plain["model"]["model_config"]


def test_refusals_are_the_preflights_words_found_before_any_worker(tmp_path, monkeypatch):
    """The preflight runs here (no process group, no worker): a refused cell is never launched. (Which cells of
    the table are refused today is the table's business, docs/finetune.md; here two layouts no trainer runs on
    2 workers are added to it.)"""
    monkeypatch.setitem(grid.LAYOUTS, "dp3", {"parallel_config.data_parallel": 3, "runner_config.batch_size": 1})
    monkeypatch.setitem(grid.LAYOUTS, "tp2_dropout", {"parallel_config.model_parallel": 2})
    monkeypatch.setitem(grid.FEATURES, "lora_dropout", {"model.model_config.pet_config": {
        "pet_type": "lora", "lora_rank": 4, "lora_alpha": 8, "lora_dropout": 0.1, "target_modules": "$lora_targets"}})
    picked = [grid.Cell("full", "qwen3", "plain", "dp3", "jit"),
              grid.Cell("lora_dropout", "qwen3", "plain", "tp2_dropout", "pynative"),
              grid.Cell("full", "qwen3", "plain", "dp2", "pynative")]              # runs
    refused, launched, refs = grid.prepare(picked, str(tmp_path))
    assert sorted(refused) == sorted(c.name for c in picked[:2])
    assert "data_parallel 3" in refused[picked[0].name] and "must equal the worker count 2" in refused[picked[0].name]
    assert "lora_dropout" in refused[picked[1].name] and "model_parallel" in refused[picked[1].name]
    assert list(launched) == [picked[2].name] and list(refs) == ["full-qwen3-plain-one-pynative"]
    with open(launched[picked[2].name]) as f:
        assert yaml.safe_load(f)["parallel_config"]["data_parallel"] == 2
    assert os.path.getsize(tmp_path / "corpus.txt") > 1000


def _export(folder, tensors, losses):
    from safetensors.numpy import save_file
    os.makedirs(folder + "_hf")
    save_file(tensors, os.path.join(folder + "_hf", "model.safetensors"))
    with open(os.path.join(folder + "_hf", "config.json"), "w") as f:
        json.dump({"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3"}, f)
    with open(os.path.join(folder, "loss.jsonl"), "w") as f:
        for i, loss in enumerate(losses):
            f.write(json.dumps({"step": i + 1, "loss": loss}) + "\n")


def test_compare_passes_within_the_tolerance_and_names_the_first_difference(tmp_path):
    w = {"a": np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4), "b": np.ones(5, np.float32)}
    ref, same, off, bad = (str(tmp_path / n) for n in ("ref", "same", "off", "bad"))
    for d in (ref, same, off, bad):
        os.makedirs(d)
    _export(ref, w, [6.0, 5.0])
    _export(same, {"a": w["a"] * (1 + 4e-6), "b": w["b"]}, [6.0 * (1 + 5e-6), 5.0])
    _export(off, {"a": w["a"], "b": w["b"] + 3e-5}, [6.0, 5.0])
    _export(bad, w, [6.0, 5.0002])
    why, detail = grid.compare(same, ref)
    assert why is None and 4e-6 <= detail["loss"] < 1e-5 and 3e-6 < detail["weights"] < 1e-5
    assert grid.compare(off, ref)[0] == "export: b differs by 3.0e-05 of its largest magnitude"
    assert grid.compare(bad, ref)[0].startswith("step 2: loss 5.0002000 against one process's 5.0000000")


def test_markdown_table_marks_and_lists_the_reasons():
    picked = grid.cells({"model": ["qwen3_moe"], "feature": ["full"], "data": ["plain"], "mode": ["jit"]})
    outcomes = {c.name: grid.Outcome("pass") for c in picked}
    outcomes[picked[0].name] = grid.Outcome("refused", "key = 1: not with x")
    outcomes[picked[1].name] = grid.Outcome("fail", "rank 0: ValueError: boom | here")
    outcomes[picked[2].name] = grid.Outcome("fail", "rank 1: ValueError: boom | here")     # one reason
    text = grid.markdown(picked, outcomes)
    lines = text.splitlines()
    assert lines[0] == "| feature | model | data | mode | " + " | ".join(grid.LAYOUTS) + " |"
    assert lines[2] == "| full | qwen3_moe | plain | jit | refused R1 | ✘ F1 | ✘ F1 | ✔ | ✔ | ✔ | ✔ | ✔ |"
    assert "8 cells: 5 ✔ (= one process), 1 refused by name before any process group, 2 ✘ failing" in text
    assert "- R1: `key = 1: not with x`" in text and "- F1: `ValueError: boom \\| here`" in text
    dense = grid.cells({"model": ["qwen3"], "feature": ["full"], "data": ["plain"], "mode": ["jit"]})
    row = grid.markdown(picked + dense, {c.name: grid.Outcome("pass") for c in picked + dense}).splitlines()[3]
    assert row.split(" | ")[-2] == "n/a"        # ep2: the dense model has no such cell


def test_error_line_takes_the_failing_cells_own_traceback(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "worker_0.log").write_text(
        "[grid] cell A on rank 0: start\nTraceback (most recent call last):\n  File x\nValueError: old\n"
        "[grid] cell B on rank 0: start\nstep 1\nTraceback (most recent call last):\n  File y\n    code\n"
        "RuntimeError: For 'Mul', input1.shape and input2.shape need to broadcast\nmore\n")
    (logs / "worker_1.log").write_text("[grid] cell B on rank 1: start\n")
    assert grid.error_line(str(logs), "B") == ("rank 0: RuntimeError: For 'Mul', input1.shape and input2.shape need "
                                               "to broadcast")
    assert grid.error_line(str(logs), "B", first=[1]).startswith("rank 0: RuntimeError")   # rank 1 has none


def test_check_grid_list_and_bad_filter(capsys):
    import importlib.util
    spec = importlib.util.spec_from_file_location("check_grid", os.path.join(SCRIPTS, "check_grid.py"))
    check_grid = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(check_grid)
    assert check_grid.main(["--only", "model=qwen3,feature=full,data=plain,mode=jit", "--list"]) == 0
    out = capsys.readouterr().out
    assert out.rstrip().endswith("7 cells: 0 refused, 7 to run, 1 references")
    assert check_grid.main(["--only", "layout=pp3"]) == 2
    assert "['pp3'] not in" in capsys.readouterr().err


def test_run_cells_records_each_cell_and_stops_at_a_non_zero_exit(tmp_path, monkeypatch):
    """The workers' body (here in this process, rank 0): a record per cell; a rank exiting non-zero raises, which
    ends the launch (its peer may be waiting in a collective of that cell)."""
    import mindformers_core.training.cli as cli
    calls = []
    monkeypatch.setattr(cli, "main", lambda argv: calls.append(argv) or (0 if argv == ["a"] else 2))
    with pytest.raises(RuntimeError, match="grid cell B: the trainer's command line exited 2 on rank 0"):
        grid.run_cells([["A", ["a"]], ["B", ["b"]], ["C", ["c"]]], str(tmp_path), deadline=60)
    assert calls == [["a"], ["b"]]
    a, b = (json.loads((tmp_path / f"{n}.rank0.json").read_text()) for n in "AB")
    assert a["status"] == "done" and a["code"] == 0 and b["status"] == "exit" and b["code"] == 2
    assert not (tmp_path / "C.rank0.json").exists()


def test_a_cell_past_its_deadline_ends_its_worker_with_a_record(tmp_path):
    """The watchdog (in a child process here: it ends the process, as it ends a hung worker): the cell's record says
    hang, the error file msrun's harness watches is written, exit code 3."""
    import subprocess
    import sys
    code = ("import time, mindformers_core.training.cli as cli\n"
            "cli.main = lambda argv: time.sleep(30)\n"
            "from mindformers_core.testing import grid\n"
            f"grid.run_cells([['H', ['x']]], {str(tmp_path)!r}, deadline=1.0)\n")
    env = dict(os.environ, MFC_ERROR_FILE=str(tmp_path / "rank_0.error"),
               PYTHONPATH=os.path.dirname(SCRIPTS) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 3, done.stderr[-2000:]
    record = json.loads((tmp_path / "H.rank0.json").read_text())
    assert record["status"] == "hang" and "deadline" in record["error"]
    assert "past its deadline of 1 s" in (tmp_path / "rank_0.error").read_text()


def test_lora_on_deepseek_loads_a_folder_holding_its_mtp_layer(tmp_path):
    """transformers writes no MTP layer; the grid's LoRA cells load the fixture with one added as DeepSeek's
    checkpoints store it (layer num_hidden_layers), so the preflight, which refuses LoRA on a folder lacking a
    base weight, lets them start, and every tensor of the fixture is kept as it was."""
    from safetensors.numpy import load_file
    cell = grid.Cell("lora", "deepseek_v3", "plain", "dp2", "pynative")
    refused, launched, refs = grid.prepare([cell], str(tmp_path))
    assert refused == {} and list(launched) == [cell.name] and list(refs) == [cell.reference]
    source = load_file(os.path.join(grid.FIXTURES, "hf", "deepseek_v3", "model.safetensors"))
    derived = load_file(str(tmp_path / "hf" / "deepseek_v3_with_mtp_layer" / "model.safetensors"))
    assert all(np.array_equal(derived[k], v) for k, v in source.items())
    added = sorted(set(derived) - set(source))
    assert added and all(k.startswith("model.layers.3.") for k in added), added
    assert {"model.layers.3.eh_proj.weight", "model.layers.3.enorm.weight",
            "model.layers.3.shared_head.norm.weight"} <= set(added)
    # without it, the same cell is refused by name (the fixture lacks the MTP layer)
    raw = grid.config_of(cell, str(tmp_path))
    raw["pretrained_model_dir"] = raw["load_checkpoint"] = os.path.join(grid.FIXTURES, "hf", "deepseek_v3")
    why = grid.refusal(grid.write_config(raw, str(tmp_path / "bare.yaml")))
    assert why is not None and "mtp.layers.3" in why, why
