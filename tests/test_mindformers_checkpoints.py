"""MindFormers' own checkpoints in and out (``models/mindformers``, ``training/export_mf.py``), proven on files that
MindFormers 2.1.0 itself wrote (tests/data/mindformers, made by scripts/make_mindformers_fixtures.py; this suite
never imports mindformers):

- each fixture (legacy Llama as ``.ckpt`` and as MindFormers' unified folder, its fused ``w_qkv`` /
  ``w_gate_hidden`` layout, legacy Qwen2 with biases, mcore Qwen3 as ``.safetensors`` and ``.ckpt``, mcore
  Qwen3-MoE, mcore DeepSeek-V3) loads and gives the reference logits (MindFormers' own forward for the legacy
  ones, transformers' for the mcore ones) to a relative 1e-5 on one process, and at tensor parallel 2 through
  ``run_mindformer.py``'s setup (the regions of the fused tensors read by slice; one body in the suite's
  batched 2-worker launch);
- our model written in MindFormers' names is bitwise the file MindFormers wrote (every family), and ours ->
  MindFormers -> ours is the identity (legacy and mcore; both fused layouts; ``.ckpt``, ``.safetensors``, unified
  folder; a ``.ckpt`` tensor split over several entries);
- the trainer fine-tunes from a MindFormers checkpoint exactly as from the Hugging Face folder it was made from,
  exports with ``--export_mf_dir`` / ``python -m mindformers_core.training.export_mf``, and names bad files
  (missing tensor, wrong shape, unknown name scheme, truncated, several ranks, resume) before training.
"""
import functools
import json
import os
import shutil
import tempfile

import numpy as np
import pytest
import yaml

import run_mindformer
from mindformers_core.models.hf.folder import FolderError, read_safetensors_header
from mindformers_core.models.mindformers import ckpt as ckpt_module
from mindformers_core.models.mindformers.ckpt import read_ckpt_index, write_ckpt
from mindformers_core.models.mindformers.export import write_checkpoint
from mindformers_core.models.mindformers.files import open_checkpoint
from mindformers_core.models.mindformers.load import load_mindformers, mindformers_weights
from mindformers_core.models.mindformers.names import FusedLayout, adapter_for, detect_scheme, mcore_adapter, Heads
from tests.msrun_batch import job
from tests.test_hf_msrun import argv, hf_yaml
from tests.test_trainer import config_of, records

HERE = os.path.dirname(os.path.abspath(__file__))
MF = os.path.join(HERE, "data", "mindformers")
HF = os.path.join(HERE, "data", "hf")
# legacy Llama fixture's sizes as MindFormers' model_config keys (the legacy ones have no config.json)
LEGACY = dict(num_layers=2, hidden_size=64, num_heads=4, n_kv_heads=2, ffn_hidden_size=128, vocab_size=320,
              seq_length=16, rms_norm_eps=1e-5, rope_theta=10000.0, hidden_act="silu")
# case -> (checkpoint inside MF, registered class, model_config (dict) or the config.hf.json folder, logits folder)
CASES = {
    "llama_ckpt": ("llama_legacy/llama.ckpt", "LlamaForCausalLM", LEGACY),
    "llama_unified": ("llama_legacy/unified", "LlamaForCausalLM", LEGACY),
    "llama_concat": ("llama_legacy_concat/llama_concat.safetensors", "LlamaForCausalLM", LEGACY),
    "qwen2_legacy": ("qwen2_legacy/qwen2.safetensors", "Qwen2ForCausalLM",
                     dict(LEGACY, rms_norm_eps=1e-6, rope_theta=1e6, tie_word_embeddings=False)),
    "qwen3_safetensors": ("qwen3/qwen3.safetensors", None, "qwen3"),
    "qwen3_ckpt": ("qwen3/qwen3.ckpt", None, "qwen3"),
    "qwen3_moe": ("qwen3_moe/qwen3_moe.ckpt", None, "qwen3_moe"),
    "deepseek_v3": ("deepseek_v3/deepseek_v3.safetensors", None, "deepseek_v3"),
}
TOL = 1e-5


def _hf_config(folder):
    """(spec, model_config) from a fixture's config.hf.json (no MTP layer: MindFormers' was built without)."""
    from mindformers_core.models.hf.config import read_hf_config
    tmp = tempfile.mkdtemp(prefix="mfcfg_")
    shutil.copyfile(os.path.join(MF, folder, "config.hf.json"), os.path.join(tmp, "config.json"))
    spec, cfg, _ = read_hf_config(tmp)
    shutil.rmtree(tmp)
    cfg = {k: v for k, v in cfg.items() if k not in ("mtp_num_layers", "num_nextn_predict_layers")}
    return spec, dict(cfg, seq_length=16)


def build(case):
    """Our model of a case, built with random weights (PyNative), and its MindFormers checkpoint path."""
    from mindformers_core.models import get_model_spec
    path, cls, config = CASES[case]
    if isinstance(config, dict):
        spec, mc = get_model_spec(cls), config
    else:
        spec, mc = _hf_config(config)
    return spec.model_class(spec.config_class.from_model_config(mc)), os.path.join(MF, path)


def reference(case):
    z = np.load(os.path.join(MF, CASES[case][0].split("/")[0], "reference.npz"))
    return z["input_ids"], z["logits"]


def rel(a, b):
    return float(np.abs(np.asarray(a, np.float64) - b).max() / np.abs(b).max())


@pytest.mark.parametrize("case", list(CASES))
def test_mindformers_checkpoint_gives_the_reference_logits(case):
    import mindspore as ms
    model, path = build(case)
    load_mindformers(model, path)
    ids, want = reference(case)
    assert rel(model(ms.Tensor(ids)).asnumpy(), want) < TOL


def test_schemes_are_detected_from_the_names():
    assert detect_scheme(open_checkpoint(os.path.join(MF, "llama_legacy/llama.ckpt")).tensors) == "legacy"
    assert detect_scheme(open_checkpoint(os.path.join(MF, "qwen3/qwen3.ckpt")).tensors) == "mcore"
    ours = ["embedding.word_embeddings.weight", "decoder.layers.0.self_attention.linear_q.weight",
            "decoder.layers.0.mlp.linear_fc1_gate.weight", "output_layer.weight"]
    assert detect_scheme(ours) is None           # our own checkpoints' names: not MindFormers'


# ------------------------------------------------------------------------------------------------ writing
def weights_of(model):
    """Our weights: the trainable parameters and the routers' expert bias (not the counters and probes)."""
    bias = bool(getattr(model.config, "moe_router_enable_expert_bias", False))
    return {p.name: p.asnumpy() for p in model.get_parameters()
            if p.requires_grad or (bias and p.name.endswith("expert_bias"))}


def _our_state(case):
    model, path = build(case)
    load_mindformers(model, path)
    return model, path, weights_of(model)


def _mf_tensors(path):
    ckpt = open_checkpoint(path)
    with ckpt.reader() as read:
        return {n: np.asarray(read(n)) for n in ckpt.tensors}


@pytest.mark.parametrize("case", ["llama_ckpt", "llama_concat", "qwen2_legacy", "qwen3_ckpt", "qwen3_moe",
                                  "deepseek_v3"])
def test_our_export_is_bitwise_the_file_mindformers_wrote(case, tmp_path):
    model, path, state = _our_state(case)
    ckpt = open_checkpoint(path)
    adapter = adapter_for(None, model.config, ckpt.tensors)
    out = write_checkpoint(str(tmp_path / "mf.safetensors"), state, adapter)
    mine, theirs = _mf_tensors(out), _mf_tensors(path)
    theirs = {n: v for n, v in theirs.items() if not n.endswith((".fi_accu", ".expert_load"))}
    assert sorted(mine) == sorted(theirs)
    for name, value in theirs.items():
        assert mine[name].shape == value.shape and np.array_equal(mine[name], value), name


LAYOUTS = [("legacy", None), ("legacy", {"qkv_concat": True}), ("mcore", None),
           ("mcore", {"use_contiguous_weight_layout_attention": True, "use_interleaved_weight_layout_mlp": False})]


@pytest.mark.parametrize("scheme,keys", LAYOUTS)
@pytest.mark.parametrize("form", ["unified", ".ckpt", ".safetensors"])
def test_ours_to_mindformers_to_ours_is_the_identity(scheme, keys, form, tmp_path):
    from mindformers_core.models.hf.config import read_hf_config
    from mindformers_core.models.hf.pretrained import from_pretrained
    folder = os.path.join(HF, "qwen2" if scheme == "legacy" else "qwen3_moe")   # biases / dense + MoE layers
    model = from_pretrained(folder, seq_length=16)
    state = weights_of(model)
    if scheme == "legacy":          # our qwen2 fixture is tied: MindFormers' legacy Llama holds an lm_head
        state["output_layer.weight"] = np.ascontiguousarray(state["embedding.word_embeddings.weight"].T)
    spec = read_hf_config(folder)[0]
    adapter = adapter_for(spec.model_type, model.config, scheme=scheme, model_config=keys)
    out = write_checkpoint(str(tmp_path / f"mf{form if form != 'unified' else ''}"), state, adapter,
                           max_part_bytes=20_000)
    ckpt = open_checkpoint(out)
    if form == "unified":
        assert len(ckpt.files) > 3 and os.path.isfile(os.path.join(out, "param_name_map.json"))
    fused = [n for n in ckpt.tensors if n.endswith(("w_qkv.weight", "linear_qkv.weight", "w_gate_hidden.weight",
                                                    "linear_fc1.weight", "experts.weight1"))]
    assert fused if (scheme == "mcore" or keys) else not fused
    back = adapter_for(spec.model_type, model.config, ckpt.tensors, model_config=keys)
    with mindformers_weights(ckpt, back, {n: v.shape for n, v in state.items()}) as values:
        for name, value in state.items():
            assert np.array_equal(values[name], value), name


def test_the_fused_layouts_are_the_ones_mindformers_describes():
    """grouped q/k/v: per kv group its q heads, then k, then v (MindFormers' concat_qkv_interleaved); interleaved
    gate/up rows (concat_linear_fc1_interleaved); contiguous: [q; k; v] and [gate; up]."""
    class C:
        num_attention_heads, num_query_groups, kv_channels, hidden_size = 4, 2, 2, 3
    h, hd, groups, rep = 3, 2, 2, 2
    q, k, v = (np.arange(h * n, dtype=np.float32).reshape(h, n) + base for n, base in ((8, 0), (4, 100), (4, 200)))
    gate, up = np.arange(h * 5, dtype=np.float32).reshape(h, 5), -np.arange(h * 5, dtype=np.float32).reshape(h, 5)
    state = {"decoder.layers.0.self_attention.linear_q.weight": q, "decoder.layers.0.self_attention.linear_k.weight": k,
             "decoder.layers.0.self_attention.linear_v.weight": v, "decoder.layers.0.mlp.linear_fc1_gate.weight": gate,
             "decoder.layers.0.mlp.linear_fc1_up.weight": up}
    grouped = mcore_adapter(Heads.of(C)).to_hf(state)
    qkv, fc1 = grouped["decoder.layers.0.self_attention.linear_qkv.weight"], grouped["decoder.layers.0.mlp.linear_fc1.weight"]
    want = np.concatenate([q.T.reshape(groups, rep * hd, h), k.T.reshape(groups, hd, h), v.T.reshape(groups, hd, h)],
                          axis=1).reshape(-1, h)
    assert np.array_equal(qkv, want)
    assert np.array_equal(fc1[0::2], gate.T) and np.array_equal(fc1[1::2], up.T)
    assert FusedLayout.of(None) == FusedLayout(False, True, True)                   # MindFormers 2.1.0's defaults
    assert FusedLayout.of({"use_contiguous_weight_layout": True}).contiguous_qkv     # the earlier mcore key
    assert not FusedLayout.of({"use_contiguous_weight_layout": True,
                               "use_contiguous_weight_layout_attention": False}).contiguous_qkv
    flat = mcore_adapter(Heads.of(C), FusedLayout(contiguous_qkv=True, interleaved_mlp=False)).to_hf(state)
    assert np.array_equal(flat["decoder.layers.0.self_attention.linear_qkv.weight"], np.concatenate([q.T, k.T, v.T]))
    assert np.array_equal(flat["decoder.layers.0.mlp.linear_fc1.weight"], np.concatenate([gate.T, up.T]))


def test_ckpt_files_split_over_entries_read_by_slice_and_mindspore_reads_ours(tmp_path, monkeypatch):
    import mindspore as ms
    rng = np.random.default_rng(0)
    tensors = {"a.weight": rng.normal(size=(37, 11)).astype(np.float32), "b": np.arange(5, dtype=np.int32),
               "c.weight": rng.normal(size=(8, 3)).astype(np.float16)}
    monkeypatch.setattr(ckpt_module, "SLICE_BYTES", 300)          # a.weight spans 6 entries, as over 512 MiB
    path = str(tmp_path / "x.ckpt")
    write_ckpt(path, tensors)
    index = read_ckpt_index(path)
    assert len(index["a.weight"].segments) == 6 and len(index["b"].segments) == 1
    ckpt = open_checkpoint(path)
    with ckpt.reader() as read:
        for name, value in tensors.items():
            assert np.array_equal(read(name), value)
        assert np.array_equal(read("a.weight", (slice(5, 29), slice(2, 7))), tensors["a.weight"][5:29, 2:7])
    theirs = ms.load_checkpoint(path)                             # MindSpore's own reader joins the entries
    assert all(np.array_equal(theirs[n].asnumpy(), v) for n, v in tensors.items())


# ------------------------------------------------------------------------------------------------ bad files
def _names_error(path, case="qwen3_safetensors"):
    model, _ = build(case)
    with pytest.raises(FolderError) as e:
        load_mindformers(model, path)
    return str(e.value)


def test_missing_tensor_wrong_shape_and_unknown_scheme_are_named(tmp_path):
    from safetensors.numpy import save_file
    tensors = _mf_tensors(os.path.join(MF, "qwen3/qwen3.safetensors"))
    missing = dict(tensors)
    del missing["decoder.layers.1.mlp.linear_fc2.weight"]
    save_file(missing, str(tmp_path / "missing.safetensors"))
    text = _names_error(str(tmp_path / "missing.safetensors"))
    assert "'decoder.layers.1.mlp.linear_fc2.weight'" in text and "mcore names" in text and "missing.safetensors" in text
    bad = dict(tensors)
    bad["decoder.layers.0.self_attention.linear_qkv.weight"] = np.zeros((120, 32), np.float32)
    save_file(bad, str(tmp_path / "shape.safetensors"))
    text = _names_error(str(tmp_path / "shape.safetensors"))
    assert "'decoder.layers.0.self_attention.linear_qkv.weight'" in text and "[120, 32]" in text and "[128, 32]" in text
    write_ckpt(str(tmp_path / "other.ckpt"), {"encoder.block.0.weight": np.zeros(3, np.float32)})
    text = _names_error(str(tmp_path / "other.ckpt"))
    assert "follow no MindFormers scheme" in text and "encoder.block.0.weight" in text


def test_broken_files_are_named(tmp_path):
    src = os.path.join(MF, "llama_legacy/llama.ckpt")
    data = open(src, "rb").read()
    (tmp_path / "cut.ckpt").write_bytes(data[:len(data) // 2])
    with pytest.raises(FolderError, match="truncated"):
        open_checkpoint(str(tmp_path / "cut.ckpt"))
    (tmp_path / "noise.ckpt").write_bytes(b"\xff" * 64)
    with pytest.raises(FolderError, match="not a MindSpore .ckpt file"):
        open_checkpoint(str(tmp_path / "noise.ckpt"))
    it = tmp_path / "root" / "iteration_00000003"
    it.mkdir(parents=True)
    (tmp_path / "root" / "latest_checkpointed_iteration.txt").write_text("3")
    for r in range(2):
        shutil.copyfile(os.path.join(MF, "qwen3/qwen3.safetensors"), it / f"model-{r:07d}-0000002.safetensors")
    with pytest.raises(FolderError, match="saved by 2 ranks"):
        open_checkpoint(str(tmp_path / "root"))
    os.remove(it / "model-0000001-0000002.safetensors")
    os.rename(it / "model-0000000-0000002.safetensors", it / "model-0000000-0000001.safetensors")
    assert sorted(open_checkpoint(str(tmp_path / "root")).tensors) == sorted(
        read_safetensors_header(os.path.join(MF, "qwen3/qwen3.safetensors"), MF))
    unified = tmp_path / "unified"
    shutil.copytree(os.path.join(MF, "llama_legacy/unified"), unified)
    os.remove(unified / "part1.safetensors")
    with pytest.raises(FolderError, match="part1.safetensors.*missing"):
        open_checkpoint(str(unified))


# ------------------------------------------------------------------------------------------------ trainer
def mf_yaml(base, case):
    """(config path, extra flags) for a run whose weights are a MindFormers fixture: the model's config and tokenizer
    from the Hugging Face fixture folder it matches, ``load_checkpoint`` the MindFormers checkpoint."""
    path, cls, config = CASES[case]
    folder = "qwen2" if isinstance(config, dict) else config
    extra = []
    if isinstance(config, dict):
        # the legacy fixtures have the qwen2 fixture's sizes; their own norm eps, rope base, untied head. The Llama
        # ones run as Qwen2ForCausalLM without biases (the same model class and legacy table): the trainer reads
        # the Llama family's data with a SentencePiece tokenizer, which cannot have the fixtures' 320 pieces
        extra = ["--model.model_config.rms_norm_eps", config["rms_norm_eps"], "--model.model_config.rope_theta",
                 config["rope_theta"], "--model.model_config.tie_word_embeddings", "False"]
        if cls == "LlamaForCausalLM":
            extra += ["--model.model_config.add_qkv_bias", "False"]
    if case == "qwen3_moe":              # MindFormers' Qwen3-MoE: every layer MoE
        extra = ["--model.model_config.mlp_only_layers", "[]"]
    if case == "deepseek_v3":            # built without the MTP layer
        extra = ["--model.model_config.num_nextn_predict_layers", 0]
    config_path = hf_yaml(os.path.join(base, case), os.path.join(HF, folder))
    with open(config_path) as f:
        raw = yaml.safe_load(f)
    raw["load_checkpoint"] = os.path.join(MF, path)
    with open(config_path, "w") as f:
        yaml.safe_dump(raw, f, sort_keys=False)
    return config_path, extra


TP2_CASES = ["llama_concat", "qwen3_moe", "deepseek_v3"]


def trainer_logits(case, config, out, extra, tp=1):
    """Our logits of the case's reference ids after the trainer's setup and restore (``run_mindformer.py``'s path)
    have loaded the MindFormers checkpoint (at ``tp``: this rank's vocab slice)."""
    import mindspore as ms
    from mindformers_core.training.trainer import Trainer
    flags = ["--mode", 1, *extra]
    if tp > 1:
        flags += ["--use_parallel", "True", "--parallel_config.model_parallel", tp]
    trainer = Trainer(config_of(argv(config, out, *flags), worker_num=tp))
    trainer.setup()
    assert trainer.restore() == 0
    trainer.model.set_train(False)
    return trainer.model(ms.Tensor(reference(case)[0])).asnumpy()


def tp2_logits(configs):
    """msrun body: each case's logits slice on this rank."""
    return {case: trainer_logits(case, config, out, extra, tp=2) for case, (config, out, extra) in configs.items()}


@functools.lru_cache(maxsize=None)
def tp2_plan():
    base = tempfile.mkdtemp(prefix="mf_tp2_")
    plan = {}
    for case in TP2_CASES:
        config, extra = mf_yaml(base, case)
        plan[case] = (config, os.path.join(base, case, "out"), extra)
    return plan


TWO = job("mindformers_tp2", 2, "tests.test_mindformers_checkpoints:tp2_logits", lambda: {"configs": tp2_plan()},
          timeout=600, group=__name__)


@pytest.mark.msrun
@pytest.mark.parametrize("case", TP2_CASES)
def test_mindformers_checkpoint_at_tp2_gives_the_reference_logits(case):
    ranks = TWO.results()
    got = np.concatenate([ranks[0][case], ranks[1][case]], axis=-1)     # the vocab-split logits, rank order
    assert rel(got, reference(case)[1]) < TOL


def test_trainer_fine_tunes_from_a_mindformers_checkpoint_as_from_its_folder(tmp_path, capsys):
    config, extra = mf_yaml(str(tmp_path), "qwen3_safetensors")
    steps = ["--runner_config.max_steps", 2, "--lr_schedule.warmup_steps", 0, "--callbacks", "[{type: MFLossMonitor}]"]
    assert run_mindformer.main(argv(config, tmp_path / "mf", *steps, *extra)) == 0
    assert "loaded weights from" in capsys.readouterr().out
    assert run_mindformer.main(argv(config, tmp_path / "hf", *steps, "--load_checkpoint",
                                    os.path.join(HF, "qwen3"))) == 0
    assert [r["loss"] for r in records(tmp_path / "mf")] == [r["loss"] for r in records(tmp_path / "hf")]
    # refused before training, named: resume, a checkpoint with a tensor missing
    assert run_mindformer.main(argv(config, tmp_path / "r", "--resume_training", "True")) == 2
    assert "a MindFormers checkpoint holds weights only" in capsys.readouterr().err
    from safetensors.numpy import save_file
    tensors = _mf_tensors(os.path.join(MF, "qwen3/qwen3.safetensors"))
    del tensors["decoder.final_layernorm.weight"]
    save_file(tensors, str(tmp_path / "broken.safetensors"))
    assert run_mindformer.main(argv(config, tmp_path / "b", *steps, "--load_checkpoint",
                                    tmp_path / "broken.safetensors")) == 2
    err = capsys.readouterr().err
    assert "'decoder.final_layernorm.weight'" in err and "broken.safetensors" in err
    assert not (tmp_path / "b" / "loss.jsonl").exists()


def test_export_mf_dir_and_the_export_command(tmp_path, capsys):
    from mindformers_core.training.export_mf import main as export_main
    config, extra = mf_yaml(str(tmp_path), "qwen3_safetensors")
    out, live = tmp_path / "run", tmp_path / "mf_live"
    assert run_mindformer.main(argv(config, out, "--runner_config.max_steps", 2, "--callbacks", "[]", *extra,
                                    "--export_mf_dir", live)) == 0
    from tests.test_trainer import saved
    weights = saved(out, 2)[0]
    ckpt = open_checkpoint(str(live))
    assert os.path.isfile(live / "param_name_map.json") and detect_scheme(ckpt.tensors) == "mcore"
    model, _ = build("qwen3_safetensors")
    adapter = adapter_for("qwen3", model.config, ckpt.tensors)
    with mindformers_weights(ckpt, adapter, {n: w.shape for n, w in weights.items()}) as values:
        assert all(np.array_equal(values[n], w) for n, w in weights.items())
    # the command: one .ckpt file in mcore names (the same tensors); refused: an existing folder, before training
    target = tmp_path / "cmd.ckpt"
    assert export_main(["--config", config, "--checkpoint", str(out / "checkpoint"), "--output", str(target),
                        "--scheme", "mcore"]) == 0
    assert sorted(open_checkpoint(str(target)).tensors) == sorted(ckpt.tensors)
    assert export_main(["--config", config, "--checkpoint", str(out / "checkpoint"), "--output", str(live)]) == 2
    assert "exists" in capsys.readouterr().err
    assert run_mindformer.main(argv(config, tmp_path / "again", *extra, "--export_mf_dir", live)) == 2
    assert "--export_mf_dir" in capsys.readouterr().err


@pytest.mark.parametrize("run_bytes", [0, 1 << 40])      # one run per group / blocks of whole groups
def test_fused_and_stacked_regions_read_only_their_rows(run_bytes, monkeypatch):
    """Any region of ours (a tensor-parallel or expert-parallel rank's) read from a fused / stacked MindFormers
    tensor equals that region of the whole tensor; reads touch only the rows the region needs."""
    from mindformers_core.models.mindformers import rules
    monkeypatch.setattr(rules, "SMALL_RUN_BYTES", run_bytes)
    rng = np.random.default_rng(1)
    h, hd, groups, rep = 6, 2, 4, 3
    mf = rng.normal(size=(groups * (rep + 2) * hd, h)).astype(np.float32)
    touched = []

    def reader(name, slices):
        touched.append(slices[0])
        return mf[slices]
    sizes = (rep * hd, hd, hd)
    for part, width in ((0, groups * rep * hd), (1, groups * hd), (2, groups * hd)):
        rule = rules.FusedRule("ours", "mf", part, sizes, 3)
        whole = rule.from_hf({}, [mf])
        for region in (((0, h), (0, width)), ((1, 5), (width // 2, width)), ((0, h), (1, width - 1))):
            touched.clear()
            got = rule.read({}, (h, width), region, reader, out=np.empty([b - a for a, b in region], np.float32))
            assert np.array_equal(got, whole[region[0][0]:region[0][1], region[1][0]:region[1][1]])
            if run_bytes == 0 and region[1] == (width // 2, width):     # the upper groups' rows only
                assert min(s.start for s in touched) >= (groups // 2) * sum(sizes)
    experts = rng.normal(size=(5 * h, 2 * 4)).astype(np.float32)            # E=5, (E*h, 2f), f=4
    up = rules.ExpertsRule("w_up", "w1", 1, 2)
    want = experts.reshape(5, h, 8)[:, :, 4:]
    got = up.read({}, (5, h, 4), ((2, 4), (0, h), (1, 3)), lambda n, s: experts[s])
    assert np.array_equal(got, want[2:4, :, 1:3])
