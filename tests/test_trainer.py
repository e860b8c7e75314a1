"""The YAML trainer on one process: exact resume, checkpoint pruning, predict, bad configs, data files.

Runs go through ``run_mindformer.main(argv)`` in this process (no interpreter start-up per run) on a
shrunken configs/llama_tiny.yaml (2 layers, hidden 64, seq 32, vocab 384) with a tokenizer trained
once per session on a ~60 KB slice of the built-in corpus. tests/test_trainer_msrun.py reuses the
helpers for the multi-worker runs.
"""
import functools
import json
import os

import numpy as np
import pytest
import yaml

import run_mindformer
from mindformers_core.training import ConfigError, load_config
from mindformers_core.training import trainer as trainer_module
from mindformers_core.training.preflight import data_files
from mindformers_core.training.trainer import Trainer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = os.path.join(ROOT, "configs", "llama_tiny.yaml")
VOCAB = 384        # > 259: a byte-fallback tokenizer needs 3 special + 256 byte pieces
STEPS = 4


@functools.lru_cache(maxsize=None)
def script(name: str):
    """``scripts/<name>.py`` imported as a module (the preprocessing scripts are not a package)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "scripts", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def mindrecord_corpus(root: str, seq_length: int) -> dict:
    """The test corpus of ``build_assets`` as MindRecord rows of ``seq_length`` tokens
    (scripts/preprocess_mindrecord.py): ``{"dir", "tokenizer"}``."""
    assets = build_assets(os.path.join(root, "assets"))
    folder = os.path.join(root, "mindrecord")
    os.makedirs(folder, exist_ok=True)
    script("preprocess_mindrecord").main(["--input", assets["corpus"], "--tokenizer", assets["tokenizer"],
                                          "--seq_length", str(seq_length),
                                          "--output", os.path.join(folder, "corpus.mindrecord")])
    return {"dir": folder, "tokenizer": assets["tokenizer"]}


def megatron_corpus(root: str, assets: dict = None) -> dict:
    """The test corpus of ``build_assets`` (or ``assets``) preprocessed by scripts/preprocess_megatron.py:
    ``{"prefix", "tokenizer"}``."""
    from mindformers_core.data.dataset import read_documents
    tiny = assets or build_assets(os.path.join(root, "assets"))
    jsonl = os.path.join(root, "corpus.jsonl")
    with open(jsonl, "w") as f:
        for doc in read_documents(tiny["corpus"]):
            f.write(json.dumps({"text": doc}) + "\n")
    prefix = script("preprocess_megatron").main(["--input", jsonl, "--tokenizer-model", tiny["tokenizer"],
                                                 "--output-prefix", os.path.join(root, "wiki")])
    return {"prefix": prefix, "tokenizer": tiny["tokenizer"]}


def build_assets(root: str) -> dict:
    """Corpus (``data/corpus.txt``), tokenizer and a shrunk test YAML under ``root``, once per process."""
    from mindformers_core.data.corpus import build_corpus
    from mindformers_core.data.tokenizer import train_tokenizer
    os.makedirs(os.path.join(root, "data"), exist_ok=True)
    corpus = build_corpus(os.path.join(root, "data", "corpus.txt"), max_bytes=60_000)
    tok = train_tokenizer([corpus], os.path.join(root, "tok"), VOCAB)
    with open(TINY) as f:
        raw = yaml.safe_load(f)
    raw["model"]["model_config"].update(num_layers=2, hidden_size=64, ffn_hidden_size=128, num_heads=4,
                                        n_kv_heads=2, seq_length=32, vocab_size=VOCAB)
    raw["train_dataset"].update(dataset_dir=corpus, tokenizer_file=tok)
    raw["runner_config"].update(batch_size=4, max_steps=STEPS)
    raw["lr_schedule"].update(total_steps=STEPS, warmup_steps=1)   # warm-up + cosine: the lr position matters
    raw["callbacks"] = [{"type": "MFLossMonitor", "per_print_times": 1},
                        {"type": "CheckpointMonitor", "save_checkpoint_steps": 2, "keep_checkpoint_max": 5}]
    path = os.path.join(root, "tiny_test.yaml")
    with open(path, "w") as f:
        yaml.safe_dump(raw, f, sort_keys=False)
    return {"yaml": path, "corpus": corpus, "data_dir": os.path.dirname(corpus), "tokenizer": tok}


@pytest.fixture(scope="session")
def tiny(tmp_path_factory):
    return build_assets(str(tmp_path_factory.getbasetemp() / "trainer_assets"))


def args(tiny, out, *extra):
    return ["--config", tiny["yaml"], "--output_dir", str(out), *map(str, extra)]


def config_of(argv, worker_num=1):
    a, overrides = run_mindformer.parse(argv)
    return load_config(a.config, [f"{k}={v}" for k, v in overrides], worker_num=worker_num)


def records(out):
    with open(os.path.join(str(out), "loss.jsonl")) as f:
        return [json.loads(line) for line in f]


def steps_in(out):
    d = os.path.join(str(out), "checkpoint")
    return sorted(int(n[5:]) for n in os.listdir(d) if n.startswith("step_") and n[5:].isdigit())


def saved(out, step):
    """Merged weights, AdamW moments and the training state of ``<out>/checkpoint/step_<step>``."""
    from mindformers_core.checkpoint import (checkpoint_specs, load_checkpoint, load_optimizer_state,
                                             load_training_state)
    d = os.path.join(str(out), "checkpoint")
    specs = checkpoint_specs(d, step)
    return (load_checkpoint(d, specs, step=step), load_optimizer_state(d, specs, step=step),
            load_training_state(d, step))


@pytest.fixture(scope="module")
def uninterrupted(tiny, tmp_path_factory):
    """4 PyNative steps in one go (checkpoints 2 and 4), reading the data *directory*."""
    out = tmp_path_factory.mktemp("uninterrupted")
    assert run_mindformer.main(args(tiny, out, "--train_dataset.dataset_dir", tiny["data_dir"])) == 0
    return out


def test_resume_is_exact_and_restores_every_state(tiny, uninterrupted, tmp_path):
    """2 steps, stop, resume for 2: the losses/lrs/grad norms equal the uninterrupted run's, and so do
    the final weights, moments and data position. keep_checkpoint_max 2 keeps only the newest two; a
    fresh run in a used output_dir is refused, and with overwrite_output_dir starts a new loss log."""
    ref = records(uninterrupted)
    assert [r["step"] for r in ref] == list(range(1, STEPS + 1)) and ref[-1]["loss"] < ref[0]["loss"]
    assert steps_in(uninterrupted) == [2, 4]
    out = tmp_path / "interrupted"
    out.mkdir()
    (out / "loss.jsonl").write_text('{"step": 1, "loss": 99.0}\n{"step": 7, "loss": 99.0}\n')   # a stale log
    every1 = ["--callbacks", "[{type: MFLossMonitor}, {type: CheckpointMonitor, save_checkpoint_steps: 1, "
                             "keep_checkpoint_max: 2}]"]
    half = STEPS // 2
    assert run_mindformer.main(args(tiny, out, *every1, "--runner_config.max_steps", half)) == 2   # not silently
    assert run_mindformer.main(args(tiny, out, *every1, "--runner_config.max_steps", half,
                                    "--overwrite_output_dir", "True")) == 0
    assert [r["step"] for r in records(out)] == list(range(1, half + 1))

    trainer = Trainer(config_of(args(tiny, out, *every1, "--resume_training", "True")))
    trainer.setup()
    assert trainer.restore() == half
    assert trainer.data.consumed_samples == half * 4                        # data iterator position
    assert int(trainer.optimizer.global_step.asnumpy()) == half             # step counter ...
    assert trainer.lr.at(half) == pytest.approx(ref[half]["lr"], rel=1e-12)  # ... hence the lr position
    weights, moments, _ = saved(uninterrupted, half)                        # equal to the other run's
    for p, m, v in zip(trainer.params, trainer.optimizer.moment1, trainer.optimizer.moment2):
        np.testing.assert_array_equal(p.asnumpy(), weights[p.name])
        np.testing.assert_array_equal(m.asnumpy(), moments["adam_m"][p.name])
        np.testing.assert_array_equal(v.asnumpy(), moments["adam_v"][p.name])
    history = trainer.train()
    assert [r["step"] for r in history] == list(range(half + 1, STEPS + 1))

    got = records(out)                                                      # the log continues
    assert [r["step"] for r in got] == [r["step"] for r in ref]
    for g, r in zip(got, ref):
        assert g["loss"] == pytest.approx(r["loss"], rel=1e-6), g["step"]
        assert g["grad_norm"] == pytest.approx(r["grad_norm"], rel=1e-6), g["step"]
        assert g["lr"] == pytest.approx(r["lr"], rel=1e-12), g["step"]
    assert steps_in(out) == [STEPS - 1, STEPS]                              # keep_checkpoint_max: 2
    (w1, o1, s1), (w2, o2, s2) = saved(out, STEPS), saved(uninterrupted, STEPS)
    for name in w2:
        np.testing.assert_allclose(w1[name], w2[name], rtol=1e-6, atol=1e-7)
        for state in ("adam_m", "adam_v"):
            np.testing.assert_allclose(o1[state][name], o2[state][name], rtol=1e-5, atol=1e-9)
    assert s1.data_states[0]["consumed_samples"] == s2.data_states[0]["consumed_samples"] == STEPS * 4
    assert s1.trainer_state["step"] == s2.trainer_state["step"] == STEPS


@pytest.mark.parametrize("mode", [1, 0], ids=["pynative", "jit"])
def test_accumulation_and_recompute_keep_the_losses(tiny, uninterrupted, tmp_path, mode, capsys):
    """2 micro-steps of 2 rows = one batch of 4 rows; recomputed layers change memory, not numbers."""
    out = tmp_path / "accumulated"
    assert run_mindformer.main(args(tiny, out, "--mode", mode, "--train_dataset.dataset_dir", tiny["data_dir"],
                                    "--runner_config.batch_size", 2, "--runner_config.gradient_accumulation_steps", 2,
                                    "--recompute_config.recompute", "True", "--callbacks", "[]")) == 0
    assert "recompute: 2 Cells (decoder.layers.0, decoder.layers.1)" in capsys.readouterr().out
    got, want = records(out), records(uninterrupted)
    assert [r["step"] for r in got] == [r["step"] for r in want]
    for g, w in zip(got, want):
        assert abs(g["loss"] - w["loss"]) <= 1e-5 * abs(w["loss"]), (got, want)
        assert abs(g["grad_norm"] - w["grad_norm"]) <= 1e-4 * abs(w["grad_norm"]), (got, want)


@pytest.mark.parametrize("mode", [1, 0], ids=["pynative", "jit"])
def test_log_grad_norm_false_skips_the_norm_only_when_nothing_needs_it(tiny, tmp_path, mode):
    """No clipping, no guard, log_grad_norm false: the step computes no norm (null in loss.jsonl), the
    losses are those of the same run with the norm logged; clipping or the guard still get their norm."""
    from mindformers_core.training.steps import build_guard, clip_limit, norm_needed
    plain = ["--mode", mode, "--runner_config.max_steps", 2, "--runner_config.max_grad_norm", 0,
             "--runner_config.use_skip_step_on_nan", "False", "--callbacks", "[]"]
    logged, skipped = tmp_path / "logged", tmp_path / "skipped"
    assert run_mindformer.main(args(tiny, logged, *plain)) == 0
    assert run_mindformer.main(args(tiny, skipped, *plain, "--runner_config.log_grad_norm", "False")) == 0
    want, got = records(logged), records(skipped)
    assert [r["step"] for r in got] == [r["step"] for r in want] == [1, 2]
    assert all(r["grad_norm"] is None for r in got) and all(r["grad_norm"] > 0 for r in want)
    for g, w in zip(got, want):
        assert abs(g["loss"] - w["loss"]) <= 1e-6 * abs(w["loss"]), (got, want)
    for extra, needed in [((), False), (("--runner_config.max_grad_norm", 1.0), True),
                          (("--runner_config.use_skip_step_on_nan", "True"), True),
                          (("--runner_config.global_norm_skip_threshold", 10.0), True)]:
        cfg = config_of(args(tiny, tmp_path / "cfg", *plain, "--runner_config.log_grad_norm", "False", *extra))
        limit = clip_limit(float(cfg.runner_config.max_grad_norm))
        assert norm_needed(cfg, limit, build_guard(cfg)) is needed, extra


def test_mindrecord_data_gives_the_text_runs_losses(tiny, uninterrupted, tmp_path, capsys):
    """scripts/preprocess_mindrecord.py writes the packed windows; read back through MindDataset they
    come in the same order as the text pipeline's, so the losses are the text run's; a file written
    for another seq_length is refused naming the key."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("preprocess", os.path.join(ROOT, "scripts",
                                                                             "preprocess_mindrecord.py"))
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    data = tmp_path / "mindrecord"
    for seq in (32, 16):
        script.main(["--input", tiny["corpus"], "--tokenizer", tiny["tokenizer"], "--seq_length", str(seq),
                     "--output", str(data / f"s{seq}" / "corpus.mindrecord")])
    assert sorted(n for n in os.listdir(data / "s32") if not n.startswith(".")) == [
        "corpus.mindrecord", "corpus.mindrecord.db"]        # no temporary directory left (.token_cache is reused)
    out = tmp_path / "out"
    common = ["--train_dataset.type", "mindrecord", "--runner_config.max_steps", 2, "--callbacks", "[]"]
    assert run_mindformer.main(args(tiny, out, "--train_dataset.dataset_dir", data / "s32", *common)) == 0
    got, want = records(out), records(uninterrupted)[:2]
    assert [r["loss"] for r in got] == pytest.approx([r["loss"] for r in want], rel=1e-6)
    capsys.readouterr()
    assert run_mindformer.main(args(tiny, tmp_path / "bad", "--train_dataset.dataset_dir", data / "s16", *common)) == 2
    assert "rows hold [17] tokens, but seq_length=32 needs 33" in capsys.readouterr().err


def test_eval_callback_loss_equals_the_checkpoint_on_the_held_out_batches(tiny, uninterrupted, tmp_path):
    """EvalCallBack at step 2: the mean loss of the first eval_steps batches of eval_dataset (file
    order) under the weights of step 2; training itself is unchanged."""
    from mindspore import Tensor
    from mindformers_core.data.dataset import PackedDataset
    from mindformers_core.models.llama import LlamaConfig, LlamaForCausalLM
    out = tmp_path / "eval"
    argv = args(tiny, out, "--train_dataset.dataset_dir", tiny["data_dir"], "--eval_dataset.dataset_dir",
                tiny["corpus"], "--eval_dataset.eval_steps", 2, "--runner_config.max_steps", 2,
                "--callbacks", "[{type: MFLossMonitor}, {type: EvalCallBack, eval_interval: 2}]")
    assert run_mindformer.main(argv) == 0
    got = records(out)
    assert [r["loss"] for r in got] == [r["loss"] for r in records(uninterrupted)[:2]]
    assert "eval_loss" not in got[0]
    cfg = config_of(argv)
    model = LlamaForCausalLM(LlamaConfig.from_model_config(cfg.model.model_config))
    weights, _, _ = saved(uninterrupted, 2)
    for p in model.trainable_params():
        p.set_data(Tensor(weights[p.name]))
    data = iter(PackedDataset([tiny["corpus"]], tiny["tokenizer"], cfg.model.model_config.seq_length,
                              cache_dir=str(tmp_path / "cache"), shuffle=False))
    want = []
    for _ in range(2):
        batch = [next(data) for _ in range(cfg.runner_config.batch_size)]
        ids, labels = (np.stack([b[i] for b in batch]) for i in (0, 1))
        want.append(float(model(Tensor(ids), Tensor(labels)).asnumpy()))
    assert got[1]["eval_loss"] == pytest.approx(np.mean(want), rel=1e-5)
    assert abs(got[1]["eval_loss"] - got[1]["loss"]) > 1e-4      # other batches than the training step's


def test_predict_is_greedy_deterministic_and_matches_the_logits(tiny, uninterrupted, tmp_path, capsys):
    """run_mode predict prints prompt + greedy continuation; the tokenizer comes from the checkpoint;
    the first new token is the argmax of an unparallelized model's logits for the loaded weights."""
    from mindspore import Tensor
    from mindformers_core.models.llama import LlamaConfig, LlamaForCausalLM
    prompt = "Return the"
    argv = args(tiny, tmp_path / "p", "--run_mode", "predict", "--load_checkpoint",
                uninterrupted / "checkpoint" / f"step_{STEPS}", "--train_dataset.tokenizer_file", "",
                "--predict_data", prompt, "--max_new_tokens", 3)
    assert run_mindformer.main(argv) == 0
    printed = capsys.readouterr().out.strip().splitlines()[-1]
    assert printed.startswith(prompt) and len(printed) > len(prompt)

    trainer = Trainer(config_of(argv))
    assert trainer.tokenizer_file == os.path.abspath(tiny["tokenizer"])     # recorded in the checkpoint
    trainer.setup()
    trainer.restore()
    tok = trainer.tokenizer
    ids = [tok.bos_token_id] + tok.encode(prompt, add_bos=False)
    new = trainer.generate(ids, 3)
    assert tok.decode(ids[1:] + new) == printed                              # a second run: same text

    weights, _, _ = saved(uninterrupted, STEPS)
    cfg = config_of(argv)
    model = LlamaForCausalLM(LlamaConfig.from_model_config(cfg.model.model_config))
    for p in model.trainable_params():
        p.set_data(Tensor(weights[p.name]))
    x = np.full((1, cfg.model.model_config.seq_length), tok.eos_token_id, np.int32)   # not predict's padding
    x[0, :len(ids)] = ids
    logits = model(Tensor(x)).asnumpy()
    assert new[0] == int(logits[0, len(ids) - 1].argmax())


# ---------------------------------------------------------------- bad configurations: exit 2, before init
UNSAFE = "seed: !!python/object/apply:os.system ['touch {marker}']\n"


@pytest.mark.parametrize("workers, extra, expected", [
    (4, ["--use_parallel", "True"],
     ["parallel_config = data_parallel 1 x model_parallel 1 x context_parallel 1 x pipeline_stage 1 = 1: "
      "must equal the worker count 4"]),
    (2, ["--use_parallel", "True", "--parallel_config.pipeline_stage", 2],
     ["parallel_config.micro_batch_num = 1: must be >= parallel_config.pipeline_stage (2)"]),
    (2, ["--use_parallel", "True", "--parallel_config.pipeline_stage", 2, "--parallel_config.micro_batch_num", 2,
         "--model.model_config.num_layers", 3],
     ["model.model_config.num_layers = 3: not divisible by pipeline_stage 2 x pipeline_interleave 1 = 2 stages"]),
    (3, ["--use_parallel", "True", "--parallel_config.model_parallel", 3],
     ["model.model_config.num_heads = 4: must be divisible by parallel_config.model_parallel = 3",
      "model.model_config.n_kv_heads = 2: must be divisible by parallel_config.model_parallel = 3"]),
    (1, ["--parallel_config.data_paralel", 2],
     ["parallel_config.data_paralel = 2: unknown override key; did you mean 'parallel_config.data_parallel'?"]),
    (1, ["--runner_config.batch_size", "four", "--parallel_config.data_parallel", "True"],
     ["runner_config.batch_size = 'four': must be int (got str)",
      "parallel_config.data_parallel = True: must be int (got bool)"]),
    (2, ["--use_parallel", "True", "--parallel_config.pipeline_stage", 2, "--parallel_config.micro_batch_num", 3,
         "--parallel.pipeline_config.pipeline_scheduler", "dualpipev",
         "--parallel.pipeline_config.pipeline_interleave", 2, "--model.model_config.num_layers", 4],
     ["parallel.pipeline_config.pipeline_scheduler = 'dualpipev' with parallel_config.pipeline_stage 2, "
      "pipeline_interleave 2, micro_batch_num 3: ScheduleDualPipeV: "]),
    (2, ["--use_parallel", "True", "--parallel_config.pipeline_stage", 2, "--parallel_config.micro_batch_num", 2,
         "--parallel.pipeline_config.pipeline_scheduler", "zbv", "--parallel.pipeline_config.pipeline_interleave", 2,
         "--parallel.pipeline_config.layers_per_stage", "[1, 0, 0, 1]"],
     ["parallel.pipeline_config.layers_per_stage = [1, 0, 0, 1]: pipeline rank 1 would hold stages [1, 2] with no "
      "layers and no embedding or output layer"]),
    (1, ["--model.model_config.vocab_size", 512],
     ["model.model_config.vocab_size = 512: must equal the tokenizer's vocabulary, 384 pieces in "
      "train_dataset.tokenizer_file = "]),
    (1, ["--train_dataset.dataset_dir", "/nonexistent/corpus.txt"],
     ["train_dataset.dataset_dir = '/nonexistent/corpus.txt': no such file or directory"]),
    (1, ["--load_checkpoint", "/nonexistent/checkpoint"],
     ["load_checkpoint = '/nonexistent/checkpoint': no such checkpoint directory or file"]),
    (1, ["--runner_config.max_grad_norm", -1, "--runner_config.max_steps", 0],
     ["runner_config.max_grad_norm = -1: must be >= 0",
      "runner_config.max_steps = 0: must be -1 (the epochs decide) or >= 1"]),
    (1, ["--callbacks", "[{type: EvalCallBack}]"],
     ["eval_dataset.dataset_dir = None: EvalCallBack needs held-out data"]),
    (2, ["--use_parallel", "True", "--run_mode", "predict", "--parallel_config.data_parallel", 2],
     ["parallel_config.data_parallel = 2 with run_mode = 'predict': generation keeps every prompt of a batch on "
      "every rank"]),
    (2, ["--use_parallel", "True", "--run_mode", "predict", "--parallel_config.context_parallel", 2],
     ["parallel_config.context_parallel = 2 with run_mode = 'predict': prediction keeps the whole sequence on every "
      "rank (a sequence-split KV cache is not designed); set context_parallel: 1"]),
], ids=["workers", "micro_batch", "layers", "heads", "unknown_key", "types", "pipeline_schedule",
         "pipeline_empty_rank", "vocab",
        "dataset_dir", "load_checkpoint", "runner", "eval_without_data", "predict_parallel", "cp_predict"])
def test_bad_config_exits_2_before_any_process_group(tiny, tmp_path, monkeypatch, capsys, workers, extra, expected):
    def no_init(*a, **k):
        raise AssertionError("a process group was requested for a bad configuration")
    monkeypatch.setattr(trainer_module, "init_distributed", no_init)
    monkeypatch.setattr(trainer_module, "get_env", no_init)
    monkeypatch.setenv("MS_WORKER_NUM", str(workers))
    assert run_mindformer.main(args(tiny, tmp_path / "out", *extra)) == 2
    err = capsys.readouterr().err
    assert "invalid configuration" in err
    for line in expected:
        assert line in err, err
    assert not os.path.exists(tmp_path / "out")


def test_bad_yaml_files_exit_2(tiny, tmp_path, capsys):
    marker = tmp_path / "pwned"
    unsafe = tmp_path / "unsafe.yaml"
    unsafe.write_text(UNSAFE.format(marker=marker))
    assert run_mindformer.main(["--config", str(unsafe)]) == 2
    err = capsys.readouterr().err
    assert f"{unsafe}:1: could not determine a constructor for the tag" in err
    assert "never Python objects from tags" in err and not marker.exists()

    raw = yaml.safe_load(open(tiny["yaml"]))
    raw["runner_config"]["max_step"] = 3
    typo = tmp_path / "typo.yaml"
    typo.write_text(yaml.safe_dump(raw))
    assert run_mindformer.main(["--config", str(typo)]) == 2
    assert "runner_config.max_step = 3: unknown key; did you mean 'runner_config.max_steps'?" in capsys.readouterr().err


def test_dataset_dir_file_or_directory(tmp_path):
    for name in ("b.txt", "a.txt", "c.jsonl", ".hidden.txt"):
        (tmp_path / name).write_text("x\n")
    (tmp_path / "sub").mkdir()
    assert data_files(str(tmp_path), "text") == [str(tmp_path / "a.txt"), str(tmp_path / "b.txt")]
    assert data_files(str(tmp_path), "jsonl") == [str(tmp_path / "c.jsonl")]
    assert data_files(str(tmp_path / "a.txt"), "text") == [str(tmp_path / "a.txt")]
    with pytest.raises(ConfigError, match=r"a plain-text file but train_dataset.type = 'jsonl'"):
        data_files(str(tmp_path / "a.txt"), "jsonl")
    with pytest.raises(ConfigError, match=r"directory holds no text files"):
        data_files(str(tmp_path / "sub"), "text")
