"""Hugging Face config.json -> the registered family and its model_config (``models/hf/config.py``), the
families' name tables against the tensors ``transformers`` saved (tests/data/hf, headers only), the way back
(``write_hf_config``), and the YAML side: ``pretrained_model_dir`` in both dialects, the value alias table,
``auto_register`` and ``use_flash_attention: True``. Pure config work plus tiny models built in one process."""
import json
import os
import struct

import pytest

from mindformers_core.models import get_model_spec
from mindformers_core.models.hf.config import HFConfigError, read_hf_config, write_hf_config
from mindformers_core.training import ConfigError, read_yaml, validate
from mindformers_core.training import cli
from mindformers_core.training.dialects import translate

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HF = os.path.join(ROOT, "tests", "data", "hf")
CONFIGS = os.path.join(ROOT, "tests", "data", "mindformers_configs")
FAMILIES = {"llama": "LlamaForCausalLM", "llama_bf16": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
            "qwen3": "Qwen3ForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM", "qwen3_moe_sharded": "Qwen3MoeForCausalLM"}
have_fixtures = pytest.mark.skipif(not os.path.isdir(os.path.join(HF, "qwen3_moe")), reason="tests/data/hf not made")


def headers(folder):
    """{tensor name: shape} of every safetensors file of a folder (the JSON header only)."""
    out = {}
    for name in sorted(os.listdir(folder)):
        if name.endswith(".safetensors"):
            with open(os.path.join(folder, name), "rb") as f:
                (n,) = struct.unpack("<Q", f.read(8))
                header = json.loads(f.read(n))
            out.update({k: tuple(v["shape"]) for k, v in header.items() if k != "__metadata__"})
    return out


def write(folder, config, name="config.json"):
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, name), "w") as f:
        f.write(config if isinstance(config, str) else json.dumps(config))
    return str(folder)


QWEN3_4X = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "num_hidden_layers": 2, "hidden_size": 32,
            "intermediate_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
            "vocab_size": 320, "rms_norm_eps": 1e-6, "rope_theta": 5e5, "torch_dtype": "bfloat16",
            "rope_scaling": None, "attention_bias": False, "tie_word_embeddings": False, "max_position_embeddings": 64}


# ------------------------------------------------------------------------------------------ the families
@have_fixtures
@pytest.mark.parametrize("fixture", sorted(FAMILIES))
def test_fixture_config_builds_the_model_whose_names_and_shapes_are_the_saved_tensors(fixture):
    folder = os.path.join(HF, fixture)
    spec, mc, generation = read_hf_config(folder)
    assert spec.name == FAMILIES[fixture] and generation["eos_token_id"] == 2
    assert spec.tokenizer == ("llama" if fixture.startswith("llama") else "hf")
    config = spec.config_class.from_model_config(dict(mc, seq_length=16))
    model = spec.model_class(config)
    saved = headers(folder)
    adapter, covered = spec.state_dict_adapter, set()
    for p in model.trainable_params():
        for hf, shape in adapter.hf_shapes(p.name, p.shape).items():
            hf = hf if hf in saved else adapter.fallbacks.get(hf, hf)        # Qwen2's tied lm_head
            assert saved.get(hf) == shape, (p.name, hf, shape, saved.get(hf))
            covered.add(hf)
    assert covered == set(saved), sorted(set(saved) - covered)              # every saved tensor is one of ours
    assert {adapter.ours_of_hf(h) for h in saved} <= {p.name for p in model.trainable_params()}


@have_fixtures
def test_fixture_specifics_qwen3_head_dim_and_moe_layers():
    _, mc, _ = read_hf_config(os.path.join(HF, "qwen3"))
    cfg = get_model_spec("Qwen3ForCausalLM").config_class.from_model_config(dict(mc, seq_length=16))
    assert cfg.head_dim == 16 != cfg.hidden_size // cfg.num_attention_heads and cfg.qk_layernorm
    assert cfg.rotary_base == 5e5 and cfg.layernorm_epsilon == 1e-6
    _, mc, _ = read_hf_config(os.path.join(HF, "qwen3_moe"))           # 5.x: num_local_experts, rope_parameters
    assert mc["num_experts"] == 8 and mc["rope_theta"] == 1e6 and mc["mlp_only_layers"] == [0]
    cfg = get_model_spec("Qwen3MoeForCausalLM").config_class.from_model_config(dict(mc, seq_length=16))
    assert [cfg.is_moe_layer(n) for n in (1, 2, 3)] == [False, True, True]
    assert cfg.moe_router_norm_topk_prob and cfg.moe_aux_loss_coeff == 0.001 and not cfg.moe_shared_expert_intermediate_size
    assert cfg.moe_router_load_balancing_type == "aux_loss" and cfg.moe_ffn_hidden_size == 16
    _, mc, _ = read_hf_config(os.path.join(HF, "qwen2"))
    cfg = get_model_spec("Qwen2ForCausalLM").config_class.from_model_config(dict(mc, seq_length=16))
    assert cfg.add_qkv_bias and cfg.tie_word_embeddings and not cfg.qk_layernorm


@have_fixtures
@pytest.mark.parametrize("fixture", ["llama", "qwen2", "qwen3", "qwen3_moe"])
def test_write_hf_config_gives_back_the_folders_config(fixture, tmp_path):
    with open(os.path.join(HF, fixture, "config.json")) as f:
        saved = json.load(f)
    spec, mc, _ = read_hf_config(os.path.join(HF, fixture))
    out = write_hf_config(spec, mc)
    theta = saved.get("rope_theta", (saved.get("rope_parameters") or {}).get("rope_theta"))
    experts = saved.get("num_experts", saved.get("num_local_experts"))
    for key in ("architectures", "model_type", "num_hidden_layers", "hidden_size", "intermediate_size",
                "num_attention_heads", "num_key_value_heads", "vocab_size", "max_position_embeddings",
                "rms_norm_eps", "tie_word_embeddings", "num_experts_per_tok", "moe_intermediate_size",
                "norm_topk_prob", "router_aux_loss_coef"):
        if key in saved:
            assert out[key] == saved[key], key
    assert out["rope_theta"] == theta and out.get("head_dim") == saved.get("head_dim")
    if experts:
        assert out["num_experts"] == experts
        assert [i for i in range(saved["num_hidden_layers"]) if i in out["mlp_only_layers"]] == saved["mlp_only_layers"]
    spec2, mc2, _ = read_hf_config(write(tmp_path, out))
    assert spec2 is spec and {k: v for k, v in mc2.items()} == {k: v for k, v in mc.items()}


@pytest.mark.parametrize("spelling", ["4.x", "5.x"])
def test_both_transformers_spellings_give_the_same_model_config(spelling, tmp_path):
    hf = dict(QWEN3_4X, architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe", num_experts=4,
              num_experts_per_tok=2, moe_intermediate_size=16, norm_topk_prob=True, decoder_sparse_step=2,
              mlp_only_layers=[], router_aux_loss_coef=0.01)
    if spelling == "5.x":
        hf["num_local_experts"] = hf.pop("num_experts")
        hf["rope_parameters"] = {"rope_type": "default", "rope_theta": hf.pop("rope_theta")}
        hf["dtype"] = hf.pop("torch_dtype")
        del hf["rope_scaling"]
    spec, mc, _ = read_hf_config(write(tmp_path, hf))
    assert spec.name == "Qwen3MoeForCausalLM"
    assert mc == {"qk_layernorm": True, "seq_length": 4096, "norm_topk_prob": True, "moe_router_load_balancing_type":
                  "aux_loss", "moe_aux_loss_coeff": 0.01, "num_layers": 2, "hidden_size": 32, "ffn_hidden_size": 64,
                  "num_heads": 4, "n_kv_heads": 2, "head_dim": 16, "vocab_size": 320, "rms_norm_eps": 1e-6,
                  "rope_theta": 5e5, "tie_word_embeddings": False, "max_position_embeddings": 64, "num_experts": 4,
                  "num_experts_per_tok": 2, "moe_intermediate_size": 16, "decoder_sparse_step": 2,
                  "mlp_only_layers": []}
    cfg = spec.config_class.from_model_config(dict(mc, seq_length=16))
    assert [cfg.is_moe_layer(n) for n in (1, 2)] == [False, True]          # layer i MoE when (i + 1) % 2 == 0


# ------------------------------------------------------------------------------------------ errors
@pytest.mark.parametrize("change,message", [
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "config.json: rope_scaling = {'rope_type': 'yarn'"),
    ({"rope_parameters": {"rope_type": "llama3", "rope_theta": 5e5}}, "config.json: rope_parameters.rope_type = 'llama3'"),
    ({"architectures": ["MistralForCausalLM"], "model_type": "mistral"},
     "config.json: architectures = ['MistralForCausalLM']: not a registered Hugging Face architecture"),
    ({"architectures": ["MyModel"], "auto_map": {"AutoModel": "my.MyModel"}}, "remote code, which is never imported"),
    ({"attention_bias": True}, "config.json: attention_bias = True: biases on the q/k/v and output projections"),
    ({"num_hidden_layers": "2"}, "config.json: num_hidden_layers = '2': must be an integer >= 1"),
    ({"use_sliding_window": True}, "config.json: use_sliding_window = True: sliding-window attention"),
    ({"num_experts": 8}, "config.json: num_experts = 8: a mixture-of-experts key, but Qwen3ForCausalLM is a dense"),
    ({"rope_theta": 1e6, "rope_parameters": {"rope_theta": 5e5}}, "rope_parameters.rope_theta = 500000.0: disagrees "
                                                                   "with rope_theta"),
    ({"hidden_size": None}, "config.json: hidden_size is missing"),
])
def test_a_config_json_that_cannot_work_is_named(change, message, tmp_path):
    folder = write(tmp_path, {k: v for k, v in dict(QWEN3_4X, **change).items() if v is not None})
    with pytest.raises(HFConfigError) as e:
        read_hf_config(folder)
    assert message in str(e.value) and os.path.join(folder, "config.json") in str(e.value)


def test_missing_and_malformed_files_are_named(tmp_path):
    with pytest.raises(HFConfigError, match="no such directory"):
        read_hf_config(str(tmp_path / "nowhere"))
    with pytest.raises(HFConfigError, match=r"config\.json: no such file"):
        read_hf_config(str(tmp_path))
    with pytest.raises(HFConfigError, match=r"config\.json: not valid JSON \(line 1"):
        read_hf_config(write(tmp_path, '{"architectures": ["Qwen3ForCausalLM"],'))
    with pytest.raises(HFConfigError, match=r"generation_config\.json: must hold a JSON object"):
        read_hf_config(write(write(tmp_path, QWEN3_4X), "[1, 2]", "generation_config.json"))


def test_a_folder_is_data_its_python_files_are_never_imported(tmp_path):
    folder = write(tmp_path, dict(QWEN3_4X, auto_map={"AutoModelForCausalLM": "modeling_evil.Evil"}))
    marker = tmp_path / "imported"
    (tmp_path / "modeling_evil.py").write_text(f"open({str(marker)!r}, 'w').write('x')\nclass Evil: pass\n")
    (tmp_path / "__init__.py").write_text(f"open({str(marker)!r}, 'w').write('x')\n")
    spec, _, _ = read_hf_config(folder)                          # a registered architecture: read, nothing run
    cfg = validate(read_yaml(os.path.join(CONFIGS, "pretrain_qwen3_32b_4k.yaml")),
                   ["--pretrained_model_dir", folder, "--trust_remote_code", "True", "--parallel_config.model_parallel",
                    "1", "--parallel_config.pipeline_stage", "1", "--model.model_config.offset", "0"])
    assert spec.name == "Qwen3ForCausalLM" and not marker.exists()
    assert ("trust_remote_code", "remote code (a model folder is data: no Python file in it is ever imported)") \
        in cfg.report.not_applied


# ------------------------------------------------------------------------------------------ the YAML side
def _qwen3_folder(tmp_path, **change):
    return write(tmp_path / "Qwen3-tiny", dict(QWEN3_4X, **change))


FINETUNE = os.path.join(CONFIGS, "finetune_qwen3.yaml")
GRAPH_SIZES = ["--parallel_config.model_parallel", "1", "--parallel_config.pipeline_stage", "1",
               "--parallel_config.micro_batch_num", "1", "--train_dataset.data_loader.type", "MindDataset",
               "--train_dataset.data_loader.dataset_dir", "/data"]


def _finetune_raw():
    """MindFormers' real qwen3 finetune file without its HFDataLoader section (the SFT loader is another
    issue's): only its own keys in model.model_config, the rest from pretrained_model_dir."""
    raw = read_yaml(FINETUNE)
    raw["train_dataset"]["data_loader"] = {"type": "MindDataset", "dataset_dir": "/data"}
    return raw


def test_real_qwen3_finetune_file_reads_its_model_from_pretrained_model_dir(tmp_path):
    folder = _qwen3_folder(tmp_path)
    cfg = validate(_finetune_raw(), ["--pretrained_model_dir", folder, "--parallel_config.model_parallel", "1",
                                     "--parallel_config.pipeline_stage", "1", "--model.model_config.seq_length", "32",
                                     "--model.model_config.compute_dtype", "float32"])
    mc = cfg.model.model_config
    assert cfg.model.arch.type == "Qwen3ForCausalLM" and cfg.pretrained_model_dir == folder
    assert (mc.num_layers, mc.hidden_size, mc.num_heads, mc.n_kv_heads, mc.head_dim, mc.vocab_size) == (2, 32, 4, 2, 16, 320)
    assert mc.qk_layernorm is True and mc.rope_theta == 5e5 and mc.seq_length == 32      # the YAML's key wins
    assert mc.param_init_dtype == "float32" and mc.tie_word_embeddings is False           # the YAML's untie_... wins
    with pytest.raises(ConfigError) as e:
        validate(_finetune_raw(), ["--parallel_config.model_parallel", "1", "--parallel_config.pipeline_stage", "1"])
    assert "pretrained_model_dir = '/path/to/Qwen3-32B': no such directory" in str(e.value)


def test_pynative_file_and_the_flag_read_the_folder_and_errors_name_config_json(tmp_path, capsys):
    folder = _qwen3_folder(tmp_path, num_hidden_layers=0)
    raw = {"training": {"steps": 1, "local_batch_size": 1}, "pretrained_model_dir": folder, "model": {"seq_length": 16}}
    with pytest.raises(ConfigError) as e:
        validate(raw)
    assert f"{folder}/config.json: num_hidden_layers = 0: must be an integer >= 1" in str(e.value)
    raw["pretrained_model_dir"] = _qwen3_folder(tmp_path / "good")
    cfg = validate(raw, ["--model.num_hidden_layers", "3"])              # the PyNative spelling overrides it
    assert cfg.model.model_config.num_layers == 3 and cfg.model.arch.type == "Qwen3ForCausalLM"
    assert cfg.model.model_config.head_dim == 16 and cfg.report.dialect == "pynative"
    path = tmp_path / "graph.yaml"
    path.write_text("model:\n  model_config:\n    seq_length: 16\n")
    capsys.readouterr()
    code = cli.main(["--config", str(path), "--check_config", "--pretrained_model_dir", folder])
    assert code == 2 and f"{folder}/config.json: num_hidden_layers = 0" in capsys.readouterr().err


def test_a_yaml_that_contradicts_the_folder_is_named(tmp_path):
    folder = _qwen3_folder(tmp_path)
    raw = {"pretrained_model_dir": folder, "model": {"arch": {"type": "LlamaForCausalLM"},
                                                      "model_config": {"seq_length": 16}}}
    with pytest.raises(ConfigError) as e:
        validate(raw)
    assert f"model.arch.type = 'LlamaForCausalLM': contradicts {folder}/config.json: architectures = " \
           "'Qwen3ForCausalLM'" in str(e.value)
    raw = {"pretrained_model_dir": folder, "load_checkpoint": folder,
           "model": {"model_config": {"seq_length": 16, "num_attention_heads": 8}}}
    with pytest.raises(ConfigError) as e:
        validate(raw)
    assert f"model.model_config.num_attention_heads = 8: contradicts {folder}/config.json: num_attention_heads = 4, " \
           "and load_checkpoint loads that folder's weights" in str(e.value)
    del raw["load_checkpoint"]                                       # training from scratch: the YAML wins
    assert validate(raw).model.model_config.num_heads == 8


def test_the_alias_table_reads_mindformers_values():
    raw = read_yaml(os.path.join(CONFIGS, "pretrain_qwen3_32b_4k.yaml"))
    cfg = validate(raw, ["--parallel_config.model_parallel", "1", "--parallel_config.pipeline_stage", "1",
                         "--model.model_config.offset", "0", "--parallel_config.context_parallel_algo", "colossalai_cp",
                         "--model.model_config.compute_dtype", "fp32", "--model.model_config.params_dtype", "fp16"])
    pc, mc = cfg.parallel_config, cfg.model.model_config
    assert pc.context_parallel_algo == "colossal" and mc.compute_dtype == "float32" and mc.param_init_dtype == "float16"
    for theirs, ours in (("ulysses_cp", "ulysses"), ("hybrid_cp", "hybrid"), ("hybird_cp", "hybrid")):
        out, _, errors = translate({"parallel_config": {"context_parallel_algo": theirs}})
        assert not errors and out["parallel_config"]["context_parallel_algo"] == ours
    out, _, _ = translate({"parallelism": {"context_parallel_method": "ulysses_cp"}})
    assert out["parallel_config"]["context_parallel_method"] == "ulysses"
    assert cfg.model.arch.type == "Qwen3ForCausalLM" and mc.head_dim == 128 and mc.use_flash_attention is True
    assert [line for line in cfg.report.summary() if "unfused" in line] == [
        "  fused kernels: attention is computed unfused on CPU (the same result): model.model_config.use_flash_attention"]


def test_real_qwen3_moe_file_is_read_with_its_moe_keys():
    raw = read_yaml(os.path.join(CONFIGS, "pretrain_qwen3_30b_a3b_4k.yaml"))
    cfg = validate(raw, ["--parallel_config.model_parallel", "1", "--parallel_config.pipeline_stage", "1",
                         "--parallel_config.expert_parallel", "1", "--model.model_config.seq_length", "4096"])
    mc = cfg.model.model_config
    assert cfg.model.arch.type == "Qwen3MoeForCausalLM" and mc.moe_router_load_balancing_type == "aux_loss"  # gbs_aux_loss
    assert mc.num_experts == 128 and mc.norm_topk_prob is False and mc.head_dim == 128 and mc.moe_aux_loss_coeff == 0.001
    listed = dict(cfg.report.not_applied)
    assert {"print_separate_loss", "model.model_config.moe_router_pre_softmax",
            "model.model_config.moe_token_drop_policy"} <= set(listed)


def test_auto_register_imports_the_module_and_uses_the_class(tmp_path):
    pkg = tmp_path / "research_models"
    pkg.mkdir()
    (pkg / "tiny_family.py").write_text(
        "from mindformers_core.models.llama import LlamaConfig, LlamaForCausalLM\n"
        "class TinyConfig(LlamaConfig):\n    pass\n"
        "class TinyForCausalLM(LlamaForCausalLM):\n    pass\n")
    os.environ["REGISTER_PATH"] = str(pkg)
    try:
        cfg = validate({"seed": 1, "model": {"arch": {"type": "TinyForCausalLM", "auto_register": "tiny_family.TinyForCausalLM"},
                                  "model_config": {"auto_register": "tiny_family.TinyConfig", "num_layers": 2,
                                                   "hidden_size": 32, "num_heads": 4, "vocab_size": 64,
                                                   "seq_length": 16}}})
    finally:
        del os.environ["REGISTER_PATH"]
    spec = get_model_spec(cfg.model.arch.type)
    assert spec.name == "TinyForCausalLM" and spec.config_class.__name__ == "TinyConfig"
    with pytest.raises(ConfigError, match="model.arch.auto_register = 'tiny_family.TinyConfig': .* is registered with "
                                          "the config class|TinyConfig is not a registered model"):
        validate({"seed": 1, "model": {"arch": {"auto_register": "tiny_family.TinyConfig"},
                            "model_config": {"num_layers": 2, "hidden_size": 32, "num_heads": 4, "vocab_size": 64,
                                             "seq_length": 16}}})


from tests.test_megatron_data import megatron  # noqa: E402,F401  (the .bin/.idx fixture)


def test_real_qwen3_moe_file_trains_2_steps(megatron, tmp_path, capsys):  # noqa: F811
    """MindFormers' Qwen3-30B-A3B file as it is (Qwen3MoeForCausalLM, head_dim, gbs_aux_loss, pre-softmax router,
    probs drop policy, use_flash_attention: True), sizes, data and parallel sizes overridden."""
    out = tmp_path / "out"
    argv = ["--config", os.path.join(CONFIGS, "pretrain_qwen3_30b_a3b_4k.yaml"), "--output_dir", out,
            "--use_parallel", False, "--mode", 1, "--parallel_config.data_parallel", 1,
            "--parallel_config.model_parallel", 1, "--parallel_config.pipeline_stage", 1,
            "--parallel_config.expert_parallel", 1, "--parallel_config.micro_batch_num", 1,
            "--model.model_config.num_hidden_layers", 2, "--model.model_config.hidden_size", 32,
            "--model.model_config.num_attention_heads", 4, "--model.model_config.num_key_value_heads", 2,
            "--model.model_config.head_dim", 16, "--model.model_config.intermediate_size", 64,
            "--model.model_config.num_experts", 4, "--model.model_config.num_experts_per_tok", 2,
            "--model.model_config.moe_intermediate_size", 16, "--model.model_config.vocab_size", 384,
            "--model.model_config.seq_length", 32, "--model.model_config.compute_dtype", "float32",
            "--recompute_config.recompute", False,
            "--train_dataset.data_loader.config.data_path", f"['1', '{megatron['prefix']}']",
            "--train_dataset.tokenizer_file", megatron["tokenizer"], "--runner_config.batch_size", 2,
            "--runner_config.max_steps", 2, "--lr_schedule.learning_rate", 1e-3]
    capsys.readouterr()
    code = cli.main([str(a) for a in argv])
    got = capsys.readouterr()
    assert code == 0, got.err
    with open(out / "loss.jsonl") as f:
        rows = [json.loads(line) for line in f]
    assert len(rows) == 2 and all(4 < r["loss"] < 8 for r in rows), rows     # ln(384) = 5.95
    assert "attention is computed unfused" in got.out
