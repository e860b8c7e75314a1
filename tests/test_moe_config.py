"""MoE keys as MindFormers writes them, read into the model before any process group: DeepSeek-V3's
graph-mode ``moe_config`` block and the Qwen3-MoE / mcore ``model_config`` keys reach TransformerConfig;
bad sizes and unsupported combinations are named errors from the preflight (pure Python)."""
import os

import pytest
import yaml

from mindformers_core.models.llama import LlamaConfig
from mindformers_core.training import ConfigError, load_config
from mindformers_core.training.dialects import translate
from mindformers_core.training.preflight import moe_key_message, preflight
from mindformers_core.training.shape import JobShape

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = os.path.join(ROOT, "research", "llama", "llama_tiny.yaml")


def write(tmp_path, **sections):
    with open(TINY) as f:
        raw = yaml.safe_load(f)
    for key, value in sections.items():
        raw[key] = value
    path = tmp_path / "moe.yaml"
    path.write_text(yaml.safe_dump(raw))
    return str(path)


def model_config(cfg):
    return LlamaConfig.from_model_config(cfg.model.model_config.to_dict(), cfg.parallel_config.to_dict())


def test_deepseek_moe_config_block_reaches_the_model(tmp_path):
    moe = {"expert_num": 8, "num_experts_chosen": 2, "shared_expert_num": 1, "moe_intermediate_size": 32,
           "routed_scaling_factor": 2.5, "first_k_dense_replace": 1, "use_gating_sigmoid": True,
           "balance_via_topk_bias": True, "topk_bias_update_rate": 0.002, "n_group": 4, "topk_group": 2,
           "aux_loss_types": ["expert"], "aux_loss_factors": [0.001], "topk_method": "group_limited_greedy",
           "use_fused_ops_topkrouter": True, "capacity_factor": 1.5, "routing_policy": "TopkRouterV2"}
    cfg = load_config(write(tmp_path, moe_config=moe))
    c = model_config(cfg)
    assert (c.num_moe_experts, c.moe_router_topk, c.moe_ffn_hidden_size) == (8, 2, 32)
    assert c.moe_shared_expert_intermediate_size == 32 and c.moe_first_k_dense_layers == 1
    assert c.moe_router_score_function == "sigmoid" and c.moe_router_topk_scaling_factor == 2.5
    assert (c.moe_router_num_groups, c.moe_router_group_topk) == (4, 2)
    assert c.moe_router_enable_expert_bias and c.moe_router_bias_update_rate == 0.002
    assert c.moe_aux_loss_coeff == 0.001 and c.moe_expert_capacity_factor is None     # dropless here
    with open(write(tmp_path, moe_config=moe)) as f:
        _, report, errors = translate(yaml.safe_load(f))
    listed = [k for k, _ in report.not_applied]
    assert not errors and "moe_config.capacity_factor" in listed and "moe_config.use_fused_ops_topkrouter" in listed


def test_qwen3_moe_model_keys_and_one_expert_is_dense(tmp_path):
    cfg = load_config(TINY, ["model.model_config.num_experts=4", "model.model_config.num_experts_per_tok=2",
                             "model.model_config.moe_intermediate_size=48", "model.model_config.norm_topk_prob=False",
                             "model.model_config.router_aux_loss_coef=0.01",
                             "model.model_config.moe_router_load_balancing_type=aux_loss"])
    c = model_config(cfg)
    assert (c.num_moe_experts, c.moe_router_topk, c.moe_ffn_hidden_size) == (4, 2, 48)
    assert c.moe_router_norm_topk_prob is False
    assert c.moe_aux_loss_coeff == 0.01 and c.moe_router_load_balancing_type == "aux_loss"
    dense = model_config(load_config(write(tmp_path, moe_config={"expert_num": 1})))
    assert dense.num_moe_experts is None


@pytest.mark.parametrize("overrides, workers, message", [
    (["parallel_config.expert_parallel=2", "parallel_config.data_parallel=2"], 2,
     "parallel_config.expert_parallel = 2: needs a mixture-of-experts model"),
    (["model.model_config.num_experts=4", "parallel_config.expert_parallel=3", "parallel_config.data_parallel=4"], 4,
     "parallel_config.expert_parallel = 3: must divide parallel_config.data_parallel = 4"),
    (["model.model_config.num_experts=6", "parallel_config.expert_parallel=4", "parallel_config.data_parallel=4"], 4,
     "model.model_config.num_experts = 6: must be divisible by parallel_config.expert_parallel = 4"),
    (["model.model_config.num_experts=8", "model.model_config.num_experts_per_tok=9"], 1,
     "model.model_config.num_experts_per_tok = 9: must be an integer in [1, model.model_config.num_experts = 8]"),
    (["model.model_config.num_experts=8", "model.model_config.n_group=3"], 1,
     "model.model_config.n_group = 3: must be an integer >= 1 dividing model.model_config.num_experts = 8"),
    (["model.model_config.num_experts=8", "model.model_config.moe_token_drop_policy=probs",   # (dropless: no drop,
      "model.model_config.moe_expert_capacity_factor=1.0"], 1,                                 # accepted)
     "model.model_config.moe_token_drop_policy = 'probs': must be one of ['position']"),
    (["model.model_config.num_experts=6", "parallel_config.expert_parallel=3", "parallel_config.data_parallel=6",
      "parallel.enable_parallel_optimizer=True", "hsdp.shard_size=2"], 6,
     "hsdp.shard_size = 2 with parallel_config.expert_parallel = 3: hsdp: shard_size=2 with expert parallel size 3"),
    (["model.model_config.num_experts=4", "parallel_config.expert_parallel=2", "parallel_config.data_parallel=2",
      "parallel_config.context_parallel=2"], 4,
     "parallel_config.expert_parallel = 2 with parallel_config.context_parallel = 2"),
    (["model.model_config.num_experts=4", "model.model_config.moe_aux_loss_micro_batches=2",
      "parallel_config.data_parallel=2"], 2,
     "model.model_config.moe_aux_loss_micro_batches = 2: must be 1 with parallel_config.data_parallel = 2"),
])
def test_preflight_names_moe_problems_before_any_process_group(overrides, workers, message, tmp_path):
    cfg = load_config(TINY, overrides + (["use_parallel=True"] if workers > 1 else []), worker_num=workers)
    with pytest.raises(ConfigError) as e:
        preflight(cfg, JobShape.from_config(cfg), workers, str(tmp_path))
    assert any(message in line for line in e.value.errors), e.value.errors


@pytest.mark.parametrize("extra", [[], ["parallel.enable_parallel_optimizer=True", "hsdp.optimizer_level=level2"],
                                   ["parallel.enable_parallel_optimizer=True", "hsdp.optimizer_level=level3",
                                    "context.mode=0"]])
def test_a_good_moe_config_passes_the_shape_checks(extra, tmp_path):
    cfg = load_config(TINY, ["model.model_config.num_experts=4", "parallel_config.expert_parallel=2",
                             "parallel_config.data_parallel=2", "use_parallel=True"] + extra, worker_num=2)
    try:
        preflight(cfg, JobShape.from_config(cfg), 2, str(tmp_path))
    except ConfigError as e:          # only file checks may complain (no corpus given here)
        assert not [x for x in e.errors if "expert" in x or "num_experts" in x or "hsdp" in x], e.errors


def test_model_config_messages_name_the_yaml_keys():
    assert moe_key_message("TransformerConfig: moe_router_group_topk=5: must be an integer in [1, "
                           "moe_router_num_groups=4] when groups are set") == \
        ("model.model_config.topk_group = 5: must be an integer in [1, model.model_config.n_group = 4] when groups "
         "are set")
