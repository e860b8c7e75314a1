"""A model family is one package: a toy family written here (into tmp_path) -- its config class, a
spec function with a different MLP (GELU with biases, GPT-2's) and attention (Qwen3's q/k norm) under
LayerNorm, its Hugging Face name table -- registered by one ``@register_model(...)`` line, loaded with
``--register_path``, trained 2 steps through the command line and converted to Hugging Face names and
back with ``research/llama/convert_weight.py``, no file outside the package touched. Also the table
adapter itself (``models/state_dict.py``) and the Llama family's table."""
import json
import math
import os
import sys
import textwrap

import numpy as np
import pytest
import yaml

import mindspore as ms
from mindspore import Tensor

from mindformers_core.models import NameRule, StateDictAdapter, get_model_spec, layer_rules, registry

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = "mfc_toy_family"

FILES = {
    "__init__.py": """
        from .model import ToyForCausalLM
        """,
    "config.py": """
        from dataclasses import dataclass

        from mindformers_core.models import LlamaConfig


        @dataclass
        class ToyConfig(LlamaConfig):
            '''Llama's keys with LayerNorm.'''
            normalization: str = "LayerNorm"
        """,
    "hf.py": """
        from mindformers_core.models import NameRule, StateDictAdapter, layer_rules

        TOP = {"embedding.word_embeddings.weight": ("transformer.wte.weight", False),
               "decoder.final_layernorm.weight": ("transformer.ln_f.weight", False),
               "decoder.final_layernorm.bias": ("transformer.ln_f.bias", False),
               "output_layer.weight": ("lm_head.weight", True)}
        LAYER = {"input_layernorm.weight": ("ln_1.weight", False), "input_layernorm.bias": ("ln_1.bias", False),
                 "self_attention.linear_q.weight": ("attn.q_proj.weight", True),
                 "self_attention.linear_k.weight": ("attn.k_proj.weight", True),
                 "self_attention.linear_v.weight": ("attn.v_proj.weight", True),
                 "self_attention.linear_proj.weight": ("attn.out_proj.weight", True),
                 "self_attention.q_layernorm.weight": ("attn.q_norm.weight", False),
                 "self_attention.k_layernorm.weight": ("attn.k_norm.weight", False),
                 "pre_mlp_layernorm.weight": ("ln_2.weight", False), "pre_mlp_layernorm.bias": ("ln_2.bias", False),
                 "mlp.fc_in.weight": ("mlp.c_fc.weight", True), "mlp.fc_in.bias": ("mlp.c_fc.bias", False),
                 "mlp.fc_out.weight": ("mlp.c_proj.weight", True), "mlp.fc_out.bias": ("mlp.c_proj.bias", False)}
        TOY_HF = StateDictAdapter([NameRule(ours, hf, t) for ours, (hf, t) in TOP.items()]
                                  + layer_rules("decoder.layers.{i}.", "transformer.h.{i}.", LAYER))
        """,
    "model.py": """
        from mindspore import nn

        from mindformers_core.models import register_model
        from mindformers_core.transformer import (GELU, AttentionSpec, ColumnParallelLinear, GPTModel, HeadNorm,
                                                  LayerSpec, RowParallelLinear)

        from .config import ToyConfig
        from .hf import TOY_HF


        class ToyMLP(nn.Cell):
            '''GPT-2's MLP: GELU, biases on both projections, whatever the config's activation.'''

            def __init__(self, config):
                super().__init__()
                h, f = config.hidden_size, config.ffn_hidden_size
                self.fc_in = ColumnParallelLinear(h, f, config, bias=True)
                self.act = GELU()
                self.fc_out = RowParallelLinear(f, h, config, bias=True)

            def construct(self, x):
                return self.fc_out(self.act(self.fc_in(x)))


        def toy_layer_spec(config, layer_number):
            return LayerSpec(attention=AttentionSpec(q_norm=HeadNorm, k_norm=HeadNorm), mlp=ToyMLP)


        @register_model("ToyForCausalLM", config_class=ToyConfig, layer_spec=toy_layer_spec, state_dict_adapter=TOY_HF)
        class ToyForCausalLM(GPTModel):
            def __init__(self, config, pre_process=None, post_process=None, pp_rank=0, vp_stage=None,
                         layers_per_stage=None):
                super().__init__(config, pre_process, post_process, toy_layer_spec, pp_rank, vp_stage,
                                 layers_per_stage)
        """,
}
MODEL = {"arch": {"type": "ToyForCausalLM"},
         "model_config": {"type": "ToyConfig", "num_layers": 2, "hidden_size": 32, "ffn_hidden_size": 64,
                          "num_heads": 4, "n_kv_heads": 2, "vocab_size": 384, "seq_length": 32,
                          "rms_norm_eps": 1.0e-5, "rope_theta": 10000.0, "compute_dtype": "float32",
                          "param_init_dtype": "float32"}}
HF_LAYER = ["ln_1.weight", "ln_1.bias", "attn.q_proj.weight", "attn.k_proj.weight", "attn.v_proj.weight",
            "attn.out_proj.weight", "attn.q_norm.weight", "attn.k_norm.weight", "ln_2.weight", "ln_2.bias",
            "mlp.c_fc.weight", "mlp.c_fc.bias", "mlp.c_proj.weight", "mlp.c_proj.bias"]
HF_TOP = ["transformer.wte.weight", "transformer.ln_f.weight", "transformer.ln_f.bias", "lm_head.weight"]


@pytest.fixture
def toy_family(tmp_path, monkeypatch):
    """The toy family's package and a training YAML for it; the registry, sys.path and sys.modules
    restored afterwards."""
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    monkeypatch.setattr(registry, "_MODEL_TYPES", dict(registry._MODEL_TYPES))
    monkeypatch.setattr(sys, "path", list(sys.path))
    pkg = tmp_path / PACKAGE
    pkg.mkdir()
    for name, text in FILES.items():
        (pkg / name).write_text(textwrap.dedent(text).lstrip())
    with open(os.path.join(ROOT, "research", "gpt_ln", "gpt_ln_tiny.yaml")) as f:
        cfg = yaml.safe_load(f)
    cfg.update(model=MODEL, output_dir=str(tmp_path / "out"))
    cfg["runner_config"]["batch_size"] = 2
    config = tmp_path / "toy.yaml"
    config.write_text(yaml.safe_dump(cfg))
    yield str(pkg), str(config)
    for name in [m for m in sys.modules if m == PACKAGE or m.startswith(PACKAGE + ".")]:
        sys.modules.pop(name)


def test_a_toy_family_in_one_package_trains_and_converts(toy_family, tmp_path, monkeypatch):
    from mindformers_core.training.cli import main
    from research.llama import convert_weight as cw
    pkg, config = toy_family
    out = tmp_path / "out"
    monkeypatch.chdir(ROOT)
    assert main(["--register_path", pkg, "--config", config, "--runner_config.max_steps", "2",
                 "--lr_schedule.total_steps", "2"]) == 0
    spec = get_model_spec("ToyForCausalLM")
    assert spec.layer_spec.__name__ == "toy_layer_spec" and spec.tokenizer == "llama"
    with open(out / "loss.jsonl") as f:
        losses = [json.loads(line)["loss"] for line in f if line.strip()]
    assert len(losses) == 2 and all(4 < x < 8 for x in losses), losses      # ln(384) = 5.95

    # the trained checkpoint -> Hugging Face names -> ours, with the converter command
    hf_file, back_file = str(tmp_path / "model.safetensors"), str(tmp_path / "back.safetensors")
    common = ["--config", config, "--register_path", pkg]
    assert cw.main(common + ["--direction", "ms2hf", "--input", str(out / "checkpoint"), "--output", hf_file]) == 0
    assert cw.main(common + ["--direction", "hf2ms", "--input", hf_file, "--output", back_file]) == 0
    trained, hf, back = cw.load_ours(str(out / "checkpoint")), cw.load_safetensors(hf_file), cw.load_safetensors(back_file)
    assert sorted(hf) == sorted(HF_TOP + [f"transformer.h.{i}.{n}" for i in range(2) for n in HF_LAYER])
    assert hf["transformer.h.1.mlp.c_fc.weight"].shape == (64, 32) and hf["lm_head.weight"].shape == (384, 32)
    np.testing.assert_array_equal(hf["transformer.h.1.mlp.c_fc.weight"], trained["decoder.layers.1.mlp.fc_in.weight"].T)
    np.testing.assert_array_equal(hf["transformer.h.0.attn.k_norm.weight"],
                                  trained["decoder.layers.0.self_attention.k_layernorm.weight"])
    assert sorted(back) == sorted(trained)
    for name in trained:                                                      # bitwise round trip
        assert back[name].dtype == trained[name].dtype and np.array_equal(back[name], trained[name]), name

    # the same logits from the Hugging Face file as from the trained checkpoint
    ms.set_seed(0)
    from_ckpt = cw.build_model(config)
    cw.load_into(from_ckpt, trained)
    ms.set_seed(1)
    from_hf = cw.build_model(config)
    cw.load_hf(from_hf, hf_file)
    ids = Tensor(np.random.RandomState(0).randint(0, 384, (2, 32)), ms.int32)
    logits = from_ckpt(ids).asnumpy()
    assert np.isfinite(logits).all()
    np.testing.assert_array_equal(from_hf(ids).asnumpy(), logits)


# ---- the table adapter ------------------------------------------------------------------------------


def test_adapter_maps_layer_patterns_both_ways():
    adapter = StateDictAdapter([NameRule("emb.weight", "model.embed.weight"),
                                NameRule("out.weight", "lm_head.weight", transpose=True)]
                               + layer_rules("decoder.layers.{i}.", "model.layers.{i}.",
                                             {"fc.weight": ("mlp.fc.weight", True), "norm.weight": ("ln.weight", False)}),
                               fallbacks={"lm_head.weight": "model.embed.weight"},
                               ignored=("model.layers.{i}.rotary.inv_freq",))
    rng = np.random.RandomState(0)
    ours = {"emb.weight": rng.rand(8, 4), "out.weight": rng.rand(4, 8), "decoder.layers.11.fc.weight": rng.rand(4, 6),
            "decoder.layers.11.norm.weight": rng.rand(4)}
    hf = adapter.to_hf(ours)
    assert sorted(hf) == ["lm_head.weight", "model.embed.weight", "model.layers.11.ln.weight",
                          "model.layers.11.mlp.fc.weight"]
    assert hf["model.layers.11.mlp.fc.weight"].shape == (6, 4) and hf["model.layers.11.mlp.fc.weight"].flags.c_contiguous
    assert adapter.hf_names("decoder.layers.3.fc.weight") == ["model.layers.3.mlp.fc.weight"]
    back = adapter.from_hf(dict(hf, **{"model.layers.11.rotary.inv_freq": np.ones(2)}))
    assert sorted(back) == sorted(ours) and all(np.array_equal(back[k], ours[k]) for k in ours)
    tied = {k: v for k, v in hf.items() if k != "lm_head.weight"}        # a tied checkpoint: lm_head from embed
    np.testing.assert_array_equal(adapter.from_hf(tied, names=["out.weight"])["out.weight"], ours["emb.weight"].T)
    with pytest.raises(KeyError, match="model.layers.2.ln.weight"):
        adapter.from_hf(hf, names=["decoder.layers.2.norm.weight"])
    with pytest.raises(KeyError, match="decoder.layers.0.attn.weight"):
        adapter.to_hf({"decoder.layers.0.attn.weight": np.ones(1)})
    with pytest.raises(KeyError, match="model.extra"):
        adapter.from_hf({"model.extra": np.ones(1)})
    with pytest.raises(ValueError, match="same fields"):
        NameRule("decoder.layers.{i}.w", "model.w")


def test_llama_family_spec_and_table():
    from mindformers_core.models import LlamaConfig, LlamaForCausalLM, llama_layer_spec
    spec = get_model_spec("LlamaForCausalLM")
    assert (spec.tokenizer, spec.layer_spec, spec.model_type) == ("llama", llama_layer_spec, "llama")
    cfg = LlamaConfig(num_layers=2, hidden_size=32, num_attention_heads=4, num_query_groups=2, vocab_size=64,
                      seq_length=8, ffn_hidden_size=48, qk_layernorm=True, add_qkv_bias=True)
    ms.set_seed(3)
    model = LlamaForCausalLM(cfg)
    state = {n: p.asnumpy() for n, p in model.parameters_and_names()}
    hf = spec.state_dict_adapter.to_hf(state)
    assert {"model.layers.1.self_attn.q_norm.weight", "model.layers.1.self_attn.k_proj.bias"} <= set(hf)   # Qwen3, Qwen2
    assert len(hf) == len(state) == 2 * (9 + 2 + 3) + 3
    back = spec.state_dict_adapter.from_hf(hf)
    assert all(np.array_equal(back[k], state[k]) for k in state) and sorted(back) == sorted(state)


def test_model_config_is_built_once_with_the_job_sizes():
    """training/model_builder: the job's sizes go into the config when it is built, never set after."""
    import dataclasses
    from mindformers_core.training import load_config
    from mindformers_core.training.model_builder import model_config_for, with_context_parallel
    from mindformers_core.training.shape import JobShape
    c = load_config(os.path.join(ROOT, "research", "llama", "llama_tiny.yaml"))
    shape = JobShape.from_config(c)
    mcfg = model_config_for(get_model_spec("LlamaForCausalLM"), c, shape)
    assert (mcfg.data_parallel_size, mcfg.tensor_model_parallel_size, mcfg.context_parallel_size) == (1, 1, 1)
    ulysses = with_context_parallel(mcfg, {"context_parallel_algo": "ulysses"}, 2)
    assert ulysses is not mcfg and mcfg.context_parallel_size == 1
    assert (ulysses.context_parallel_size, ulysses.context_parallel_algo) == (2, "ulysses")
    with pytest.raises(ValueError, match="seq_length"):                       # validated again
        dataclasses.replace(mcfg, context_parallel_size=3)
    assert math.isfinite(mcfg.layernorm_epsilon)
