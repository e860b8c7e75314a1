"""MindFormers' YAMLs as users have them: real files of both dialects (tests/data/mindformers_configs,
see its README for sources and licence) checked with ``--check_config``, the Llama-family ones trained
2 steps with size/data/parallel overrides, every run_mindformer.py flag, and a list of bad configs and
flags with their messages. Runs are in-process through ``cli.main(argv)`` on a tiny model (2 layers,
hidden 64, seq 32, vocab 384) and the tokenizer/corpus of tests/test_trainer.py.
"""
import json
import os
import re

import pytest
import yaml

from mindformers_core.training import ConfigError, read_yaml, validate
from mindformers_core.training import cli
from mindformers_core.training.dialects import PYNATIVE, detect, translate

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "tests", "data", "mindformers_configs")
STEPS = 2          # 3 until the suite had to fit 20 minutes: a file that trains, trains in 2


def real(name):
    return os.path.join(DATA, name)


def run(capsys, *argv):
    """(exit code, stdout, stderr) of run_mindformer.py with ``argv``."""
    capsys.readouterr()
    try:
        code = cli.main([str(a) for a in argv])
    except SystemExit as e:        # argparse errors
        code = e.code
    out = capsys.readouterr()
    return code, out.out, out.err


def problems(err):
    """The problem lines of an 'invalid configuration' message."""
    return [line.strip() for line in err.splitlines() if line.startswith("  ")]


def keys_of(lines):
    """The key each problem line names (text before ' = ' / ' is missing')."""
    return sorted({re.split(r" = | is missing", line, 1)[0] for line in lines})


# ------------------------------------------------------------------------------------------ real files
# What remains for each real file on this machine (one worker, no data): only keys a user must change here.
WORKERS = "parallel_config"           # the worker-count line: 'parallel_config = data_parallel 8 x ... = 8: ...'
REMAINING = {     # (issue 30: head_dim, Qwen3ForCausalLM, use_flash_attention: True and pipeline schedules named)
    "pretrain_llama2_7b.yaml": [WORKERS],
    "finetune_llama2_7b.yaml": [WORKERS],
    "finetune_qwen2_5_7b_8k.yaml": [WORKERS],
    "finetune_glm4_9b.yaml": [WORKERS],
    "pretrain_gpt2_small_fp16.yaml": [WORKERS],
    "pretrain_qwen3_32b_4k.yaml": [WORKERS],
    # HFDataLoader, its handler chain and input_columns with loss_mask/position_ids are read (issue 33); what
    # remains is the model folder ('/path/to/Qwen3-32B', so no sizes) and the worker count
    "finetune_qwen3.yaml": [WORKERS, "model.model_config.hidden_size", "model.model_config.num_heads",
                            "model.model_config.num_layers", "model.model_config.seq_length",
                            "model.model_config.vocab_size", "pretrained_model_dir"],
    # MindFormers' Qwen3MoeConfig defaults seq_length to 4096; the schema wants it given
    "pretrain_qwen3_30b_a3b_4k.yaml": [WORKERS, "model.model_config.seq_length"],
    "pretrain_deepseek3_671b.yaml": [
        WORKERS, "model.model_config.num_heads",
        "parallel.parallel_optimizer_config.optimizer_weight_shard_size",
        "parallel.pipeline_config.pipeline_scheduler"],
    "llm_pretrain_dense_template.yaml": [   # its pretrained_model_dir 'path/to/model_dir' is read, and missing
        WORKERS, "model.model_config.hidden_size", "model.model_config.num_heads", "model.model_config.num_layers",
        "model.model_config.seq_length", "model.model_config.vocab_size", "pretrained_model_dir"],
    "pynative_train_config.yaml": [
        "callbacks[0].type", "callbacks[1].type", "model.hidden_size",
        "model.num_attention_heads", "model.num_hidden_layers", "model.seq_length", "model.vocab_size"],
    # its MLA, YaRN and MTP keys are read (issue 32; tests/test_deepseek_yaml.py); bfloat16 has no CPU kernels
    "pynative_ds3.yaml": ["compute_dtype", "model.compute_dtype"],
}
NOT_APPLIED = {   # a few of the keys each file lists as not applied on CPU
    "pretrain_llama2_7b.yaml": ["context.max_device_memory", "runner_wrapper.scale_sense.loss_scale_value",
                                "parallel.strategy_ckpt_save_file", "profile", "src_strategy_path_or_dir",
                                "recompute_config.mp_comm_recompute", "train_dataset_task.type"],
    "finetune_qwen2_5_7b_8k.yaml": ["context.ascend_config.precision_mode", "context.jit_config.jit_level",
                                    "model.model_config.rotary_dtype", "callbacks.integrated_save"],
    "pretrain_qwen3_32b_4k.yaml": ["model.model_config.qkv_concat", "model.model_config.input_sliced_sig"],
    "pretrain_gpt2_small_fp16.yaml": ["moe_config.expert_num", "processor.tokenizer.type", "metric.type"],
    "pynative_train_config.yaml": ["monitor.train_state.local_norm", "profiler.enable_profiling",
                                   "checkpoint.save_path",
                                   "context.max_device_memory"],
    "pynative_ds3.yaml": ["parallelism.data_parallel_shard_strategy", "model.mla_qkv_concat"],
}


@pytest.mark.parametrize("name", sorted(REMAINING))
def test_real_file_check_names_only_what_to_change_here(name, capsys):
    code, out, err = run(capsys, "--config", real(name), "--check_config")
    lines = problems(err)
    assert code == 2 and "Traceback" not in err + out
    assert not [line for line in lines if "unknown key" in line], lines
    assert keys_of(lines) == sorted(REMAINING[name]), lines
    raw = read_yaml(real(name))
    _, report, _ = translate(raw)
    assert report.dialect == (PYNATIVE if name.startswith("pynative") else "graph") == detect(raw)
    listed = {k for k, _ in report.not_applied}
    assert set(NOT_APPLIED.get(name, [])) <= listed, sorted(listed)


LLAMA_SIZES = ["--model.model_config.num_layers", 2, "--model.model_config.hidden_size", 64,
               "--model.model_config.num_heads", 4, "--model.model_config.vocab_size", 384,
               "--model.model_config.seq_length", 32, "--model.model_config.use_flash_attention", False]


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    """The test_trainer tokenizer/corpus, and that corpus as MindRecord (seq 32) for MindDataset."""
    import importlib.util
    from tests.test_trainer import build_assets
    tiny = build_assets(str(tmp_path_factory.getbasetemp() / "trainer_assets"))
    spec = importlib.util.spec_from_file_location("preprocess", os.path.join(ROOT, "scripts", "preprocess_mindrecord.py"))
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    mr = tmp_path_factory.mktemp("mindrecord") / "s32"
    script.main(["--input", tiny["corpus"], "--tokenizer", tiny["tokenizer"], "--seq_length", "32",
                 "--output", str(mr / "corpus.mindrecord")])
    return dict(tiny, mindrecord=str(mr))


def losses(out):
    with open(os.path.join(str(out), "loss.jsonl")) as f:
        return [json.loads(line)["loss"] for line in f]


GRAPH_TRAIN = {   # file -> overrides beyond sizes, data and parallel sizes (as the file writes its keys)
    "pretrain_llama2_7b.yaml": ["--parallel_config.data_parallel", 1],
    "finetune_llama2_7b.yaml": ["--parallel_config.data_parallel", 1, "--load_checkpoint", "",
                                "--model.model_config.compute_dtype", "float32"],
    "finetune_qwen2_5_7b_8k.yaml": ["--parallel_config.data_parallel", 1, "--parallel_config.pipeline_stage", 1,
                                    "--model.model_config.n_kv_heads", 2, "--model.model_config.intermediate_size",
                                    128, "--model.model_config.compute_dtype", "float32",
                                    "--recompute_config.recompute", False, "--recompute_config.select_recompute", False],
}


@pytest.mark.parametrize("name", sorted(GRAPH_TRAIN))
def test_llama_family_file_trains_2_steps(name, assets, tmp_path, capsys):
    """The real file, with sizes, data and parallel sizes overridden on the command line (its MindDataset
    loader reads a MindRecord directory; --mode 1 runs eagerly, 2 steps)."""
    out = tmp_path / "out"
    code, stdout, err = run(capsys, "--config", real(name), "--output_dir", out, "--use_parallel", False,
                            "--mode", 1, "--gradient_accumulation_steps", 1, "--batch_size", 2,
                            "--train_dataset_dir", assets["mindrecord"],
                            "--processor.tokenizer.vocab_file", assets["tokenizer"],
                            "--runner_config.max_steps", STEPS, *LLAMA_SIZES, *GRAPH_TRAIN[name])
    assert code == 0, err
    got = losses(out)
    assert len(got) == STEPS and all(x == x and 4 < x < 8 for x in got), got     # ln(384) = 5.95
    summary = stdout[stdout.index("not applied on CPU"):]
    assert "context.max_device_memory" in summary and "runner_wrapper.scale_sense" in summary
    if "qwen" in name:
        assert "LlamaForCausalLM" in stdout


def test_pynative_train_config_trains_2_steps_with_a_llama_model(assets, tmp_path, capsys):
    """MindFormers' PyNative TrainConfig reference file: its model keys overridden to a tiny Llama,
    overrides in its own dialect (training.*, model.*, train_dataset.dataloader.*, --a.b=v)."""
    out = tmp_path / "out"
    code, stdout, err = run(
        capsys, "--config", real("pynative_train_config.yaml"), "--output_dir", out,
        "--model.architectures=LlamaForCausalLM", "--model.model_type", "llama", "--model.num_hidden_layers", 2,
        "--model.hidden_size", 64, "--model.num_attention_heads", 4, "--model.num_key_value_heads", 2,
        "--model.intermediate_size", 128, "--model.vocab_size", 384, "--model.seq_length", 32,
        "--train_dataset.dataloader.type", "MindDataset", "--train_dataset_dir", assets["mindrecord"],
        "--train_dataset.tokenizer_file", assets["tokenizer"], "--training.steps", STEPS,
        "--lr_scheduler.learning_rate", 1e-3, "--callbacks", "[]")
    assert code == 0, err
    got = losses(out)
    assert len(got) == STEPS and got[-1] < got[0]
    assert "2 accumulation steps" in stdout                       # global 4 = local 2 x dp 1 x 2
    assert "monitor.train_state.local_norm" in stdout and "profiler.enable_profiling" in stdout
    assert "monitor.tensorboard" not in stdout        # applied (output_dir '' = no event files)


# ------------------------------------------------------------------------------------------ run_mode, flags
def test_eval_and_predict_run_modes(assets, tmp_path, capsys):
    """run_mode eval prints the held-out loss of the loaded checkpoint; predict takes several prompts."""
    tiny = assets
    out = tmp_path / "train"
    base = ["--config", tiny["yaml"], "--runner_config.max_steps", 2, "--train_dataset_dir", tiny["data_dir"]]
    assert run(capsys, *base, "--output_dir", out)[0] == 0
    ckpt = out / "checkpoint"
    code, stdout, err = run(capsys, *base, "--output_dir", tmp_path / "eval", "--run_mode", "eval",
                            "--load_checkpoint", ckpt, "--eval_dataset_dir", tiny["corpus"],
                            "--eval_dataset.eval_steps", 2)
    assert code == 0, err
    line = [x for x in stdout.splitlines() if x.startswith("eval_loss")]
    assert line and 3 < float(line[0].split()[1]) < 8
    code, stdout, err = run(capsys, "--config", tiny["yaml"], "--output_dir", tmp_path / "p", "--run_mode", "predict",
                            "--load_checkpoint", ckpt, "--predict_data", "I love Beijing, because", "Return the",
                            "--max_new_tokens", 2, "--predict_batch_size", 2)
    assert code == 0, err
    printed = stdout.strip().splitlines()[-2:]
    assert printed[0].startswith("I love Beijing, because") and printed[1].startswith("Return the")


MINDFORMERS_FLAGS = [   # every flag of MindFormers' run_mindformer.py (167a50de), with a value
    ("--mode", "1"), ("--device_id", "0"), ("--device_target", "CPU"), ("--run_mode", "train"), ("--do_eval", "False"),
    ("--train_dataset_dir", None), ("--eval_dataset_dir", None), ("--predict_data", "a b"), ("--modal_type", "text"),
    ("--predict_batch_size", "1"), ("--adapter_id", "x"), ("--load_checkpoint", ""),
    ("--src_strategy_path_or_dir", "s"), ("--auto_trans_ckpt", "False"), ("--transform_process_num", "1"),
    ("--only_save_strategy", "False"), ("--resume_training", "False"), ("--strategy_load_checkpoint", "s"),
    ("--remote_save_url", "obs://x"), ("--seed", "3"), ("--use_parallel", "False"), ("--profile", "False"),
    ("--options", "runner_config.sink_size=2"), ("--epochs", "2"), ("--batch_size", "2"),
    ("--gradient_accumulation_steps", "1"), ("--sink_mode", "False"), ("--num_samples", "10"), ("--output_dir", None),
    ("--register_path", None), ("--do_sample", "False"), ("--trust_remote_code", "False"),
]


def test_every_mindformers_flag_is_accepted(assets, tmp_path, capsys):
    mf = open(os.path.join(ROOT, "tests", "data", "mindformers_configs", "README.md")).read()
    assert "Apache" in mf
    argv = ["--config", assets["yaml"], "--check_config"]
    for flag, value in MINDFORMERS_FLAGS:
        value = {"--train_dataset_dir": assets["data_dir"], "--eval_dataset_dir": assets["corpus"],
                 "--output_dir": str(tmp_path / "o"), "--register_path": os.path.join(ROOT, "research", "gpt_ln")
                 }.get(flag, value)
        argv += [flag, *value.split(" ")] if value else [flag, value]
    code, out, err = run(capsys, *argv)
    assert code == 0, err
    assert "seed: 3" in out and "epochs: 2" in out and "batch_size: 2" in out and "sink_size: 2" in out
    summary = out[out.index("not applied on CPU"):]
    for flag in ("--device_id", "--src_strategy_path_or_dir", "--profile", "--remote_save_url"):   # --do_sample: applied (predict)
        assert flag in summary


def test_check_config_prints_the_plan_and_relative_config_resolves_in_the_repository(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)           # configs/llama_tiny.yaml is not here: found in the repository
    code, out, err = run(capsys, "--config", "configs/llama_tiny.yaml", "--check_config", "--worker_num", 4,
                         "--use_parallel", True, "--parallel_config.model_parallel=2",
                         "--parallel_config.pipeline_stage", 2, "--parallel_config.micro_batch_num", 2,
                         "--output_dir", tmp_path / "o")
    assert code == 0, err
    assert "# parallel plan: 4 worker(s) = dp 1 x tp 2 x cp 1 x pp 2" in out
    assert "rank 3: pipeline rank 1" in out and "pipeline: 1f1b, 2 stages, 2 micro-batches" in out
    assert f"{os.path.join(ROOT, 'configs', 'llama_tiny.yaml')} is valid for 4 worker(s)" in out


# ------------------------------------------------------------------------------------------ mistakes
LLAMA2 = real("pretrain_llama2_7b.yaml")
PYN = real("pynative_train_config.yaml")
BAD = [   # (file, extra argv, the message line expected, in part)
    (LLAMA2, ["--context.max_device_memori", "1GB"],
     "context.max_device_memori = '1GB': unknown override key; did you mean 'context.max_device_memory'?"),
    (LLAMA2, ["--parallel_config.data_paralel", 1], "did you mean 'parallel_config.data_parallel'?"),
    (LLAMA2, ["--parallel.parallel_mod", 1], "did you mean 'parallel.parallel_mode'?"),
    (LLAMA2, ["--runner_config.epoch", 1], "did you mean 'runner_config.epochs'?"),
    (LLAMA2, ["--optimizer.beta3", 1], "optimizer.beta3 = 1: unknown override key; did you mean 'optimizer.betas'?"),
    (LLAMA2, ["--lr_schedule.warmup_ratios", 1], "did you mean 'lr_schedule.warmup_ratio'?"),
    (LLAMA2, ["--train_dataset.data_loader.dataset_dirs", "x"], "did you mean 'train_dataset.data_loader.dataset_dir'?"),
    (LLAMA2, ["--eval_dataset.input_column", "x"], "did you mean 'eval_dataset.input_columns'?"),
    (LLAMA2, ["--recompute_config.select_recompte", True], "did you mean 'recompute_config.select_recompute'?"),
    (LLAMA2, ["--model.model_config.num_layer", 2], "did you mean 'model.model_config.num_layers'?"),
    (LLAMA2, ["--model.model_config.num_hidden_layer", 2], "did you mean 'model.model_config.num_hidden_layers'?"),
    (LLAMA2, ["--runner_wrapper.scale_sense.loss_scale_valu", 1],
     "did you mean 'runner_wrapper.scale_sense.loss_scale_value'?"),
    (LLAMA2, ["--runner_wraper.type", "x"], "did you mean 'runner_wrapper.type'?"),
    (LLAMA2, ["--swap_config.swapp", True], "did you mean 'swap_config.swap'?"),
    (LLAMA2, ["--parallel_config.context_parallel_algo", "ring_cp"],
     "parallel_config.context_parallel_algo = 'ring_cp': must be one of"),
    (LLAMA2, ["--lr_schedule.type", "WarmUpStableDecayLR"],
     "lr_schedule.type = 'WarmUpStableDecayLR': MindFormers' WarmUpStableDecayLR is not implemented here"),
    (LLAMA2, ["--pretrained_model_dir", "/no/such/model"],
     "pretrained_model_dir = '/no/such/model': no such directory"),
    (LLAMA2, ["--model.model_config.moe_router_pre_softmax", "maybe"],
     "model.model_config.moe_router_pre_softmax = 'maybe': must be True or False"),
    (LLAMA2, ["--moe_config.expert_num", 8, "--moe_config.expert_model_parallel", 2],
     "moe_config.expert_model_parallel = 2: expert tensor parallelism"),
    (LLAMA2, ["--model.arch.auto_register", "no_such_module_here.Model"],
     "model.arch.auto_register = 'no_such_module_here.Model': importing it failed (ModuleNotFoundError"),
    (LLAMA2, ["--optimizer.type", "Lamb"], "optimizer.type = 'Lamb': must be one of ['AdamW', 'Adam', 'SGD']"),
    (LLAMA2, ["--lr_schedule.type", "polynomial", "--lr_schedule.power", 2.0],
     "lr_schedule.power = 2.0: only power 1.0"),
    (LLAMA2, ["--train_dataset.data_loader.type", "SFTDataLoader"],
     "train_dataset.data_loader.type = 'SFTDataLoader': this data loader is not implemented"),
    (LLAMA2, ["--parallel_config.data_parallel", 1, "--train_dataset.data_loader.type", "HFDataLoader"],
     "train_dataset.data_loader.handler = None: must be a list"),
    (LLAMA2, ["--parallel_config.data_parallel", 1, "--train_dataset.data_loader.type", "HFDataLoader",
              "--train_dataset.data_loader.path", "some-org/some-dataset"],
     "train_dataset.data_loader.path = 'some-org/some-dataset': no such local file or folder (tried "),
    (LLAMA2, ["--train_dataset.input_columns", "[labels]"], "train_dataset.input_columns = ['labels']: must be a "
                                                            "list holding 'input_ids'"),
    (LLAMA2, ["--model.model_config.qk_layernorm", 3], "model.model_config.qk_layernorm = 3"),
    (LLAMA2, ["--moe_config.expert_num", 8, "--moe_config.use_shared_expert_gating", True],
     "moe_config.use_shared_expert_gating = True: a sigmoid gate on the shared experts is not implemented"),
    (LLAMA2, ["--moe_config.expert_nun", 8], "did you mean 'moe_config.expert_num'?"),
    (LLAMA2, ["--moe_config.aux_loss_types", "[expert, device]"],
     "moe_config.aux_loss_types = ['expert', 'device']: only the expert load-balancing loss"),
    (LLAMA2, ["--do_eval", "maybe"], "do_eval = 'maybe': must be True or False"),
    (PYN, ["--training.step", 3], "training.step = 3: unknown override key; did you mean 'training.steps'?"),
    (PYN, ["--parallelism.tensor_paralel", 2], "did you mean 'parallelism.tensor_parallel'?"),
    (PYN, ["--lr_scheduler.warmup_step", 2], "did you mean 'lr_scheduler.warmup_steps'?"),
    (PYN, ["--checkpoint.save_maxx", 2], "did you mean 'checkpoint.save_max'?"),
    (PYN, ["--monitor.tensorboard.log_intervals", 2], "did you mean 'monitor.tensorboard.log_interval'?"),
    (PYN, ["--profiler.start_stepp", 2], "did you mean 'profiler.start_step'?"),
    (PYN, ["--train_dataset.dataloader.shufle", True], "did you mean 'train_dataset.dataloader.shuffle'?"),
    (PYN, ["--model.num_hidden_layer", 2], "did you mean 'model.num_hidden_layers'?"),
    (PYN, ["--context.max_device_memori", "1GB"], "did you mean 'context.max_device_memory'?"),
    (PYN, ["--epochs", 2], "--epochs 2: the PyNative TrainConfig has no such setting; use --training.steps"),
    (PYN, ["--training.global_batch_size", 3], "training.global_batch_size = 3: must be a multiple of "
                                              "training.local_batch_size 2 x data parallel 1"),
    (PYN, ["--training.rampup_batch_size", "[1, 1, 8]"], "batch-size ramp-up is not implemented"),
    (PYN, ["--parallelism.expert_paralel", 4], "did you mean 'parallelism.expert_parallel'?"),
    (PYN, ["--model.mscale", 1], "model.mscale = 1: a YaRN setting, read only with model.position_embedding_type: yarn"),
    (PYN, ["--recompute.mode", "partial"], "recompute.mode = 'partial': must be one of ['None', 'full', 'select']"),
    (PYN, ["--parallelism.tensor_parallel", 3], "parallelism = data_parallel_shard 1 x tensor_parallel 3 x "
                                                "context_parallel 1 x pipeline_parallel 1 = 3: must equal the "
                                                "worker count 1"),
    (PYN, ["--lora_config.lora_rank", 8], "lora_config.target_modules = None: name the layers to adapt"),
    (LLAMA2, ["--modal_type", "image"], "--modal_type image: only text prompts are supported here"),
]


@pytest.mark.parametrize("path,extra,message", BAD, ids=[f"{i}-{os.path.basename(b[0])[:8]}-{b[1][0]}"
                                                        for i, b in enumerate(BAD)])
def test_bad_config_or_flag_is_named(path, extra, message, capsys):
    code, out, err = run(capsys, "--config", path, "--check_config", *extra)
    assert code == 2 and "Traceback" not in err
    assert message in err, err


@pytest.mark.parametrize("argv,message", [
    (["--device_id", "-1"], "argument --device_id: -1 must be >= 0"),
    (["--use_parallel"], "argument --use_parallel: expected one argument"),
    (["--parallel_config.data_parallel"], "overrides come in pairs"),
    (["--options", "a.b"], "--options takes key=value pairs"),
    (["--profile", "maybe"], "argument --profile: 'maybe' is not a boolean (True or False)"),
])
def test_bad_flags_exit_2(argv, message, capsys):
    code, out, err = run(capsys, "--config", LLAMA2, "--check_config", *argv)
    assert code == 2 and message in err, err


def test_overrides_in_both_forms_and_dialects():
    raw = read_yaml(LLAMA2)
    cfg = validate(raw, ["--parallel_config.data_parallel=1", "--model.model_config.use_flash_attention", "False",
                         "--optimizer.beta2", "0.99"])
    assert cfg.optimizer.betas == [0.9, 0.99] and cfg.optimizer.type == "AdamW"          # FP32StateAdamWeightDecay
    assert cfg.train_dataset.type == "mindrecord" and cfg.model.model_config.param_init_dtype == "float16"
    assert cfg.lr_schedule.type == "CosineWithWarmUpLR" and cfg.report.dialect == "graph"
    gpt2 = validate(read_yaml(real("pretrain_gpt2_small_fp16.yaml")), ["--parallel_config.data_parallel", "1"])
    assert gpt2.lr_schedule.type == "LinearWithWarmUpLR" and gpt2.lr_schedule.lr_end == 1e-5    # polynomial
    qwen = validate(read_yaml(real("finetune_qwen2_5_7b_8k.yaml")), ["--parallel_config.data_parallel", "1",
                    "--parallel_config.pipeline_stage", "1", "--model.model_config.use_flash_attention", "False"])
    mc = qwen.model.model_config
    assert (mc.add_qkv_bias, mc.rope_theta, mc.ffn_hidden_size, mc.n_kv_heads) == (True, 1e6, 18944, 4)
    pyn = validate(read_yaml(PYN), ["--model.architectures", "LlamaForCausalLM", "--model.num_hidden_layers", "2",
                                    "--model.hidden_size", "64", "--model.num_attention_heads", "4",
                                    "--model.vocab_size", "384", "--model.seq_length", "32", "--callbacks", "[]",
                                    "--train_dataset.dataloader.type", "MindDataset"], worker_num=1)
    assert pyn.report.dialect == PYNATIVE and pyn.runner_config.max_steps == 100 and pyn.seed == 42
    assert pyn.runner_config.gradient_accumulation_steps == 2 and pyn.lr_schedule.learning_rate == 1e-6
    assert pyn.model.arch.type == "LlamaForCausalLM" and pyn.model.model_config.num_layers == 2
    with pytest.raises(ConfigError) as info:      # an alias's error names the key as the file writes it
        validate(read_yaml(real("pretrain_qwen3_32b_4k.yaml")), ["--parallel_config.model_parallel", "3"])
    assert "model.model_config.num_attention_heads = 64: must be divisible by parallel_config.model_parallel = 3 " \
           "(each tensor-parallel rank holds whole heads)" in info.value.errors
    evaluating = validate(read_yaml(LLAMA2), ["--do_eval", "True", "--eval_dataset.data_loader.dataset_dir", "/tmp",
                                              "--parallel_config.data_parallel", "1",
                                              "--model.model_config.use_flash_attention", "False"])
    assert [c.type for c in evaluating.callbacks] == ["MFLossMonitor", "CheckpointMonitor", "EvalCallBack"]
    assert evaluating.eval_dataset.dataset_dir == "/tmp" and evaluating.eval_dataset.type == "mindrecord"
    two = read_yaml(LLAMA2)
    two["model"]["model_config"]["num_hidden_layers"] = 2       # two spellings of one setting in one file
    with pytest.raises(ConfigError, match="model.model_config.num_hidden_layers = 2: conflicts with "
                                          "model.model_config.num_layers = 32; they are the same setting"):
        validate(two)
    pp = validate(read_yaml(PYN), ["--model.architectures", "LlamaForCausalLM", "--model.num_hidden_layers", "4",
                                   "--model.hidden_size", "64", "--model.num_attention_heads", "4",
                                   "--model.vocab_size", "384", "--model.seq_length", "32", "--callbacks", "[]",
                                   "--train_dataset.dataloader.type", "MindDataset", "--parallelism.pipeline_parallel",
                                   "2", "--parallelism.pipeline_parallel_interleave_num", "2",
                                   "--training.global_batch_size", "8"], worker_num=4)
    assert (pp.parallel_config.data_parallel, pp.parallel_config.pipeline_stage, pp.use_parallel) == (2, 2, True)
    assert pp.parallel.pipeline_config.pipeline_scheduler == "interleaved"          # 1f1b with vpp 2, as MindFormers
    assert pp.parallel_config.micro_batch_num == 2 and pp.runner_config.gradient_accumulation_steps == 1
    with pytest.raises(ConfigError) as info:      # a PyNative key's error names the PyNative key
        validate(read_yaml(PYN), ["--parallelism.tensor_parallel", "2"], worker_num=1)
    assert any(e.startswith("parallelism = data_parallel") or "parallelism.tensor_parallel" in e
               for e in info.value.errors), info.value.errors


def test_docs_hold_the_generated_key_tables():
    from mindformers_core.training.dialects import table_markdown
    with open(os.path.join(ROOT, "docs", "config.md"), encoding="utf-8") as f:
        doc = f.read()
    assert table_markdown() in doc, "docs/config.md dialect tables are stale: paste dialects.table_markdown()"


def test_launcher_keeps_quoted_arguments_and_runs_one_worker_with_python(tmp_path):
    """scripts/msrun_launcher.sh splits its command string as a shell does (MindFormers evals it): a
    quoted --predict_data reaches run_mindformer.py's parser as one prompt; one worker runs plain python."""
    import subprocess
    job = tmp_path / "job.py"
    job.write_text("import sys\nfrom mindformers_core.training.cli import parse\n"
                   "args, overrides = parse(sys.argv[1:])\nprint(args.predict_data, overrides)\n")
    cmd = f"{job} --config x.yaml --run_mode predict --predict_data 'I love Beijing, because' \"Return the\" --a.b=2"
    res = subprocess.run(["bash", os.path.join(ROOT, "scripts", "msrun_launcher.sh"), cmd, "1"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert "running it with python, without msrun" in res.stdout
    assert "['I love Beijing, because', 'Return the'] [('run_mode', 'predict'), ('a.b', '2')]" in res.stdout
    bad = subprocess.run(["bash", os.path.join(ROOT, "scripts", "msrun_launcher.sh"), f"{job} --x 'open", "1"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "unbalanced quotes" in bad.stderr


def test_llama2_check_after_the_named_changes_asks_for_data_then_passes(assets, tmp_path, capsys):
    """Round two of --check_config on the real llama2 file: with the worker count and flash attention
    changed, what remains is its empty data path (named as the file writes it); given data, it is valid."""
    common = ["--config", LLAMA2, "--check_config", "--output_dir", tmp_path / "o",
              "--parallel_config.data_parallel", 1, "--model.model_config.use_flash_attention", False]
    code, out, err = run(capsys, *common)
    assert code == 2 and problems(err) == [
        "train_dataset.data_loader.type = 'mindrecord': needs train_dataset.data_loader.dataset_dir (a .mindrecord "
        "file or a directory of them, written by scripts/preprocess_mindrecord.py)"]
    code, out, err = run(capsys, *common, "--train_dataset_dir", assets["mindrecord"],
                         "--processor.tokenizer.vocab_file", assets["tokenizer"], *LLAMA_SIZES[:-2])
    assert code == 0, err
    assert "is valid for 1 worker(s)" in out and "# parallel plan: 1 worker(s)" in out
