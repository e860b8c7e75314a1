"""Hugging Face folders through the trainer (one process): a trainer checkpoint exported as an HF folder
(``training/export_hf.py``) and loaded back with ``load_checkpoint: <folder>`` starts exactly where the
checkpoint does; the run can export its live model at the end (``--export_hf_dir``)."""
import os

import numpy as np
import pytest

import run_mindformer
from mindformers_core.models.hf.folder import open_folder
from mindformers_core.training.export_hf import export_checkpoint, main as export_main, parse_size
from tests.test_trainer import args, config_of, records, saved, tiny  # noqa: F401 (fixture)


def test_exported_checkpoint_loads_as_the_same_weights(tiny, tmp_path):
    out = tmp_path / "run"
    assert run_mindformer.main(args(tiny, out, "--runner_config.max_steps", 2)) == 0
    cfg = config_of(args(tiny, out))
    folder = export_checkpoint(cfg, str(out / "checkpoint"), str(tmp_path / "hf"), max_shard_size="20KB",
                               log=lambda *_: None)
    hf = open_folder(folder)
    assert len(hf.files) > 3 and "model.layers.1.mlp.down_proj.weight" in hf.tensors
    weights = saved(out, 2)[0]
    from mindformers_core.models.llama.hf import LLAMA_HF
    from mindformers_core.models.hf.loader import load_hf_weights
    back = load_hf_weights(hf, LLAMA_HF, {n: w.shape for n, w in weights.items()})
    assert sorted(back) == sorted(weights)
    assert all(np.array_equal(back[n], w) for n, w in weights.items())
    # fine-tuning from the folder = fine-tuning from the checkpoint's weights (same data, fresh optimizer)
    a, b = tmp_path / "from_hf", tmp_path / "from_ckpt"
    assert run_mindformer.main(args(tiny, a, "--load_checkpoint", folder, "--runner_config.max_steps", 2)) == 0
    assert run_mindformer.main(args(tiny, b, "--load_checkpoint", out / "checkpoint" / "step_2",
                                    "--runner_config.max_steps", 2)) == 0
    la, lb = [r["loss"] for r in records(a)], [r["loss"] for r in records(b)]
    assert la == lb and la[0] < records(out)[0]["loss"]


def test_export_command_and_its_errors(tiny, tmp_path, capsys):
    out = tmp_path / "run"
    assert run_mindformer.main(args(tiny, out, "--runner_config.max_steps", 2)) == 0
    cfg_path = tiny["yaml"]
    target = tmp_path / "hf"
    assert export_main(["--config", cfg_path, "--checkpoint", str(out / "checkpoint"), "--output", str(target),
                        "--dtype", "bfloat16"]) == 0
    assert {t.dtype for t in open_folder(str(target)).tensors.values()} == {"BF16"}
    assert export_main(["--config", cfg_path, "--checkpoint", str(out / "checkpoint"), "--output", str(target)]) == 2
    assert "exists" in capsys.readouterr().err
    assert export_main(["--config", cfg_path, "--checkpoint", str(tmp_path / "none"), "--output",
                        str(tmp_path / "x")]) == 2
    assert "no such checkpoint directory" in capsys.readouterr().err
    assert parse_size("2GB") == 2 * 10 ** 9 and parse_size("64KiB") == 65536 and parse_size(100) == 100
    with pytest.raises(ValueError, match="max_shard_size"):
        parse_size("2 parsecs")


def test_resume_from_an_hf_folder_is_refused_before_training(tiny, tmp_path, capsys):
    out = tmp_path / "run"
    assert run_mindformer.main(args(tiny, out, "--runner_config.max_steps", 2)) == 0
    cfg = config_of(args(tiny, out))
    folder = export_checkpoint(cfg, str(out / "checkpoint"), str(tmp_path / "hf"), log=lambda *_: None)
    assert run_mindformer.main(args(tiny, tmp_path / "r", "--load_checkpoint", folder,
                                    "--resume_training", "True")) == 2
    assert "a Hugging Face model folder holds weights only" in capsys.readouterr().err


def test_export_hf_dir_writes_the_trained_model_at_the_end(tiny, tmp_path, capsys):
    out, folder = tmp_path / "run", tmp_path / "hf_live"
    assert run_mindformer.main(args(tiny, out, "--runner_config.max_steps", 2, "--callbacks", "[]",
                                    "--export_hf_dir", folder)) == 0
    hf = open_folder(str(folder))
    weights = saved(out, 2)[0]            # the step saved for the export (no CheckpointMonitor in this run)
    from mindformers_core.models.llama.hf import LLAMA_HF
    from mindformers_core.models.hf.loader import load_hf_weights
    back = load_hf_weights(hf, LLAMA_HF, {n: w.shape for n, w in weights.items()})
    assert all(np.array_equal(back[n], w) for n, w in weights.items())
    assert hf.config["architectures"] == ["LlamaForCausalLM"]
    # refused before training: the folder exists now
    assert run_mindformer.main(args(tiny, tmp_path / "again", "--export_hf_dir", folder)) == 2
    assert "--export_hf_dir" in capsys.readouterr().err and not (tmp_path / "again" / "loss.jsonl").exists()
