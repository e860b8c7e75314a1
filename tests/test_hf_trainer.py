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


# ---- broken model folders through run_mindformer.py: exit 2, the file and the key named ----------------------
HF = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "hf")


def _edit_config(folder, **changes):
    import json
    path = os.path.join(folder, "config.json")
    with open(path) as f:
        config = json.load(f)
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    with open(path, "w") as f:
        json.dump(config, f)


def _index_edit(folder, tensor, target):
    import json
    path = os.path.join(folder, "model.safetensors.index.json")
    with open(path) as f:
        index = json.load(f)
    index["weight_map"][tensor] = target
    with open(path, "w") as f:
        json.dump(index, f)


def _truncate(path, by=64):
    with open(path, "rb+") as f:
        f.truncate(os.path.getsize(path) - by)


SHARD = "model-00002-of-00003.safetensors"
BROKEN_FOLDERS = {    # name: (source fixture, break(folder), extra flags, words the error must hold)
    "missing_config": ("qwen3", lambda d: os.remove(os.path.join(d, "config.json")), [], "config.json"),
    "malformed_config": ("qwen3", lambda d: open(os.path.join(d, "config.json"), "w").write("{\"hidden_size\": 3"),
                         [], "config.json"),
    "unknown_architecture": ("qwen3", lambda d: _edit_config(d, architectures=["MambaForCausalLM"],
                                                            model_type="mamba"), [], "MambaForCausalLM"),
    "rope_scaling": ("qwen3", lambda d: _edit_config(d, rope_scaling={"rope_type": "yarn", "factor": 4.0}), [],
                     "rope_scaling"),
    "missing_shard": ("qwen3_moe_sharded", lambda d: os.remove(os.path.join(d, SHARD)), [], SHARD),
    "truncated_shard": ("qwen3_moe_sharded", lambda d: _truncate(os.path.join(d, SHARD)), [], "truncated"),
    "index_missing_file": ("qwen3_moe_sharded", lambda d: _index_edit(d, "model.norm.weight", "model-9.safetensors"),
                           [], "model-9.safetensors"),
    "index_outside": ("qwen3_moe_sharded", lambda d: _index_edit(d, "model.norm.weight", "../x.safetensors"), [],
                      "outside the folder"),
    "index_wrong_file": ("qwen3_moe_sharded", lambda d: _index_edit(d, "model.norm.weight", SHARD), [],
                         "model.norm.weight"),
    "only_pickle": ("qwen3", lambda d: (os.remove(os.path.join(d, "model.safetensors")),
                                        open(os.path.join(d, "pytorch_model.bin"), "wb").write(b"\x80\x04.")),
                    [], "pytorch_model.bin"),
    "wrong_shapes": ("qwen3", lambda d: _edit_config(d, intermediate_size=96), [],
                     "model.layers.0.mlp.gate_proj.weight"),
    "more_layers_than_weights": ("qwen3", lambda d: _edit_config(d, num_hidden_layers=3, layer_types=None), [],
                                 "model.layers.2."),
    "contradicting_yaml": ("qwen3", lambda d: None, ["--model.model_config.hidden_size", 64], "hidden_size"),
    "no_tokenizer": ("qwen3", lambda d: os.remove(os.path.join(d, "tokenizer.json")), [], "tokenizer.json"),
}


@pytest.mark.parametrize("case", sorted(BROKEN_FOLDERS))
def test_broken_model_folders_exit_2_naming_file_and_key(tiny, tmp_path, capsys, case):
    import shutil
    import yaml
    source, breaker, extra, words = BROKEN_FOLDERS[case]
    folder = tmp_path / "model"
    shutil.copytree(os.path.join(HF, source), folder)
    breaker(str(folder))
    with open(tiny["yaml"]) as f:
        raw = yaml.safe_load(f)
    raw["model"] = {"model_config": {"seq_length": 32}}
    raw["train_dataset"].pop("tokenizer_file", None)
    config = tmp_path / "hf.yaml"
    with open(config, "w") as f:
        yaml.safe_dump(raw, f)
    code = run_mindformer.main(["--config", str(config), "--output_dir", str(tmp_path / "out"),
                                "--pretrained_model_dir", str(folder), "--load_checkpoint", str(folder),
                                "--runner_config.max_steps", "1", *map(str, extra)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert words in err, err
    assert not (tmp_path / "out" / "loss.jsonl").exists()        # nothing trained


def test_mtp_fine_tune_starts_from_a_folder_without_mtp_layers(tmp_path, capsys):
    """The DeepSeek-V3 fixture as transformers saves it (no model.layers.<num_layers> MTP tensors) with mtp_depth 1:
    the run starts, says the MTP weights keep their initial values, and its step-1 loss minus mtp_loss is the loss of
    the same run without MTP (the main model's weights are the folder's)."""
    from tests.test_hf_msrun import argv, hf_yaml
    folder = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "hf", "deepseek_v3")
    config = hf_yaml(str(tmp_path), folder)
    one = ["--runner_config.max_steps", 1, "--callbacks", "[{type: MFLossMonitor}]"]
    assert run_mindformer.main(argv(config, tmp_path / "plain", *one)) == 0
    capsys.readouterr()
    assert run_mindformer.main(argv(config, tmp_path / "mtp", *one, "--model.model_config.mtp_depth", 1)) == 0
    out = capsys.readouterr().out
    assert "holds no multi-token prediction layers" in out and "mtp.layers.3." in out, out[-2000:]
    [plain], [mtp] = records(tmp_path / "plain"), records(tmp_path / "mtp")
    assert mtp["mtp_loss"] > 0.1
    assert mtp["loss"] - mtp["mtp_loss"] == pytest.approx(plain["loss"], rel=1e-6)
