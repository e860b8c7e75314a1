"""Qwen3's q/k norm (``qk_layernorm`` / ``use_qk_norm``) in the Llama model: the per-head RMSNorm
against NumPy, its weights in the model, and MindFormers' real Qwen3 32B pretraining file trained 3 steps
on CPU (sizes, head_dim, data and parallel sizes overridden; its Megatron data section reads .bin/.idx)."""
import json
import os

import numpy as np
import pytest

import mindspore as ms
from mindspore import Tensor

from mindformers_core.models.llama import LlamaConfig, LlamaForCausalLM
from mindformers_core.training import cli
from mindformers_core.transformer.attention import HeadNorm
from tests.test_megatron_data import megatron  # noqa: F401  (the .bin/.idx fixture)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QWEN3 = os.path.join(ROOT, "tests", "data", "mindformers_configs", "pretrain_qwen3_32b_4k.yaml")


def tiny(**kw):
    return LlamaConfig(num_layers=2, hidden_size=32, num_attention_heads=4, num_query_groups=2, vocab_size=64,
                       seq_length=8, ffn_hidden_size=64, **kw)


def test_head_norm_is_rmsnorm_over_each_head():
    cfg = tiny(qk_layernorm=True)
    norm = HeadNorm(cfg.head_dim, cfg)
    w = np.random.default_rng(0).normal(size=cfg.head_dim).astype(np.float32)
    norm.weight.set_data(Tensor(w))
    x = np.random.default_rng(1).normal(size=(2, 8, 4, cfg.head_dim)).astype(np.float32)
    want = x / np.sqrt((x * x).mean(-1, keepdims=True) + cfg.layernorm_epsilon) * w
    np.testing.assert_allclose(norm(Tensor(x)).asnumpy(), want, rtol=1e-5, atol=1e-6)


def test_qk_layernorm_adds_one_weight_per_head_dim_and_changes_the_output():
    ms.set_seed(0)
    plain = LlamaForCausalLM(tiny())
    ms.set_seed(0)
    qwen = LlamaForCausalLM(tiny(qk_layernorm=True))
    names = {p.name for p in qwen.trainable_params()} - {p.name for p in plain.trainable_params()}
    assert sorted(n.split("layers.")[-1] for n in names) == sorted(
        f"{i}.self_attention.{w}_layernorm.weight" for i in range(2) for w in "qk")
    assert all(p.shape == (8,) for p in qwen.trainable_params() if p.name in names)
    ids = Tensor(np.arange(16, dtype=np.int32).reshape(2, 8) % 64)
    assert not np.allclose(plain(ids).asnumpy(), qwen(ids).asnumpy())


def test_real_qwen3_file_trains_3_steps_with_qk_norm(megatron, tmp_path, capsys):  # noqa: F811
    out = tmp_path / "out"
    argv = ["--config", QWEN3, "--output_dir", out, "--use_parallel", False, "--mode", 1,
            "--parallel_config.data_parallel", 1, "--parallel_config.model_parallel", 1,
            "--parallel_config.pipeline_stage", 1, "--parallel_config.micro_batch_num", 1,
            "--model.model_config.offset", 0, "--model.model_config.architectures", "[LlamaForCausalLM]",
            "--model.model_config.num_hidden_layers", 2, "--model.model_config.hidden_size", 64,
            "--model.model_config.num_attention_heads", 4, "--model.model_config.num_key_value_heads", 2,
            "--model.model_config.head_dim", 16, "--model.model_config.intermediate_size", 128,
            "--model.model_config.vocab_size", 384, "--model.model_config.seq_length", 32,
            "--model.model_config.max_position_embeddings", 32, "--model.model_config.compute_dtype", "float32",
            "--model.model_config.use_flash_attention", False, "--recompute_config.recompute", False,
            "--train_dataset.data_loader.config.data_path", f"['1', '{megatron['prefix']}']",
            "--train_dataset.tokenizer_file", megatron["tokenizer"], "--runner_config.batch_size", 2,
            "--runner_config.max_steps", 3, "--lr_schedule.learning_rate", 1e-3]
    capsys.readouterr()
    code = cli.main([str(a) for a in argv])
    got = capsys.readouterr()
    assert code == 0, got.err
    with open(out / "loss.jsonl") as f:
        losses = [json.loads(line)["loss"] for line in f]
    assert len(losses) == 3 and all(4 < x < 8 for x in losses), losses     # ln(384) = 5.95
    assert "qk_layernorm" not in got.out.split("not applied on CPU")[-1]   # applied, not listed


@pytest.mark.parametrize("key", ["qk_layernorm", "use_qk_norm"])
def test_pynative_names_read_as_qk_layernorm(key):
    from mindformers_core.training.dialects import translate
    out, _, errors = translate({"training": {"steps": 1}, "model": {key: True}})
    assert not errors and out["model"]["model_config"]["qk_layernorm"] is True
