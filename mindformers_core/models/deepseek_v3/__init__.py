"""The DeepSeek-V3 family (``DeepseekV3ForCausalLM``, ``model_type: deepseek_v3``): multi-latent attention
(``transformer/mla.py``) in every layer, a dense SwiGLU MLP in the first ``first_k_dense_replace`` layers and
a mixture of experts after them: sigmoid scores, ``noaux_tc`` (an expert bias that steers the choice only),
``n_group`` groups of which ``topk_group`` are kept (a group scores the sum of its two best experts), top-k,
renormalized with ``norm_topk_prob``, times ``routed_scaling_factor``, plus ``n_shared_experts`` shared
experts; rotary over interleaved pairs (``rope_interleave``), YaRN when ``rope_scaling`` says so.

One file: config (``DeepseekV3Config``), model class and layer spec, Hugging Face name table and
``config.json`` mapping, registered together. Multi-token prediction layers (``num_nextn_predict_layers``,
``model.layers.{num_hidden_layers}`` in DeepSeek's checkpoints) are read by the MTP code, not here.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Dict, Mapping, Optional

from ...transformer import LayerSpec, TransformerConfig
from ...transformer.mla import MLATransformerConfig, MultiLatentAttention
from ...transformer.mlp import MLP
from ...transformer.moe import MoELayer
from ...transformer.spec import AttentionSpec
from ..hf.config import HFConfigError, HFConfigMapping, hf_to_model_config
from ..llama.config import LlamaConfig
from ..llama.hf import TOP_MAP
from ..llama.model import LlamaForCausalLM
from ..mtp_names import SHARED_COPIES, mtp_rules
from ..registry import register_model
from ..state_dict import NameRule, StackedRule, StateDictAdapter, layer_rules

# model_config key (MindFormers' DeepSeek-V3 names) -> MLATransformerConfig field
MLA_KEYS = {"q_lora_rank": "q_lora_rank", "kv_lora_rank": "kv_lora_rank", "qk_nope_head_dim": "qk_head_dim",
            "qk_rope_head_dim": "qk_pos_emb_head_dim", "v_head_dim": "v_head_dim", "rope_scaling": "rotary_scaling",
            "rope_interleave": "rotary_interleaved", "multi_latent_attention": "multi_latent_attention"}


@dataclass
class DeepseekV3Config(LlamaConfig, MLATransformerConfig):
    """LlamaConfig with multi-latent attention and DeepSeek-V3's defaults: RMSNorm eps 1e-6, interleaved
    rotary pairs, a sigmoid router with the expert bias (``noaux_tc``) and renormalized top-k, no
    load-balancing loss term (the bias balances; ``moe_aux_loss_coeff`` turns DeepSeek's sequence-wise loss
    on)."""
    layernorm_epsilon: float = 1e-6
    rotary_interleaved: bool = True
    moe_router_score_function: str = "sigmoid"
    moe_router_enable_expert_bias: bool = True
    moe_router_norm_topk_prob: bool = True
    moe_router_load_balancing_type: str = "seq_aux_loss"
    moe_aux_loss_coeff: float = 0.0

    @classmethod
    def from_model_config(cls, model_config: Mapping[str, Any], parallel_config: Optional[Mapping[str, Any]] = None,
                          pipeline_interleave: int = 1) -> "DeepseekV3Config":
        """Llama's keys (``LlamaConfig.from_model_config``) plus ``MLA_KEYS``; bad input is a ValueError naming
        the key before anything is built."""
        rest = dict(model_config)
        mla = {MLA_KEYS[k]: rest.pop(k) for k in list(rest) if k in MLA_KEYS and rest[k] is not None}
        for k in [k for k in rest if k in MLA_KEYS]:
            rest.pop(k)
        if mla.get("multi_latent_attention", True) and mla.get("kv_lora_rank") is None:
            raise ValueError("DeepseekV3Config: model_config.kv_lora_rank is missing: multi-latent attention needs "
                             "the key/value latent's size (DeepSeek-V3: 512)")
        base = LlamaConfig.from_model_config(rest, parallel_config, pipeline_interleave)
        kwargs = {f.name: getattr(base, f.name) for f in fields(LlamaConfig) if f.init}
        for f in fields(cls):          # keys the YAML did not give keep DeepSeek's defaults, not Llama's
            if f.name in kwargs and f.name in DEFAULT_FIELDS and DEFAULT_FIELDS[f.name] not in rest:
                kwargs.pop(f.name)
        kwargs.update(mla)
        return cls(**kwargs)


# DeepseekV3Config fields whose default differs from Llama's -> the model_config key that sets them
DEFAULT_FIELDS = {"layernorm_epsilon": "rms_norm_eps", "moe_router_score_function": "scoring_func",
                  "moe_router_enable_expert_bias": "moe_router_enable_expert_bias",
                  "moe_router_norm_topk_prob": "norm_topk_prob",
                  "moe_router_load_balancing_type": "moe_router_load_balancing_type",
                  "moe_aux_loss_coeff": "moe_aux_loss_coeff"}


def deepseek_v3_layer_spec(config: TransformerConfig, layer_number: int) -> LayerSpec:
    """Multi-latent attention; a dense MLP in the first ``moe_first_k_dense_layers`` layers, a mixture of
    experts (with the shared experts the config gives) after them."""
    return LayerSpec(attention=AttentionSpec(module=MultiLatentAttention),
                     mlp=MoELayer if config.is_moe_layer(layer_number) else MLP)


class DeepseekV3ForCausalLM(LlamaForCausalLM):
    """``construct(input_ids, labels=None)`` -> loss or logits; layers from :func:`deepseek_v3_layer_spec`."""

    def __init__(self, config: DeepseekV3Config, pre_process: Optional[bool] = None,
                 post_process: Optional[bool] = None, pp_rank: int = 0, vp_stage: Optional[int] = None,
                 layers_per_stage=None):
        if layers_per_stage is None and isinstance(config, LlamaConfig):
            layers_per_stage = config.layers_per_stage()
        super(LlamaForCausalLM, self).__init__(config, pre_process, post_process, deepseek_v3_layer_spec, pp_rank,
                                               vp_stage, layers_per_stage)


# ---------------------------------------------------------------------------------------- Hugging Face names
LAYER_MAP = {   # ours inside a layer -> (Hugging Face inside a layer, transposed?)
    "input_layernorm.weight": ("input_layernorm.weight", False),
    "self_attention.linear_q_proj.weight": ("self_attn.q_proj.weight", True),
    "self_attention.linear_q_down_proj.weight": ("self_attn.q_a_proj.weight", True),
    "self_attention.q_layernorm.weight": ("self_attn.q_a_layernorm.weight", False),
    "self_attention.linear_q_up_proj.weight": ("self_attn.q_b_proj.weight", True),
    "self_attention.linear_kv_down_proj.weight": ("self_attn.kv_a_proj_with_mqa.weight", True),
    "self_attention.kv_layernorm.weight": ("self_attn.kv_a_layernorm.weight", False),
    "self_attention.linear_kv_up_proj.weight": ("self_attn.kv_b_proj.weight", True),
    "self_attention.linear_proj.weight": ("self_attn.o_proj.weight", True),
    "pre_mlp_layernorm.weight": ("post_attention_layernorm.weight", False),
    "mlp.linear_fc1_gate.weight": ("mlp.gate_proj.weight", True),          # dense layers
    "mlp.linear_fc1_up.weight": ("mlp.up_proj.weight", True),
    "mlp.linear_fc2.weight": ("mlp.down_proj.weight", True),
    "mlp.router.weight": ("mlp.gate.weight", True),                        # MoE layers
    "mlp.router.expert_bias": ("mlp.gate.e_score_correction_bias", False),
    "mlp.shared_experts.linear_fc1_gate.weight": ("mlp.shared_experts.gate_proj.weight", True),
    "mlp.shared_experts.linear_fc1_up.weight": ("mlp.shared_experts.up_proj.weight", True),
    "mlp.shared_experts.linear_fc2.weight": ("mlp.shared_experts.down_proj.weight", True),
}
EXPERT_MAP = {
    "mlp.experts.w_gate": ("mlp.experts.{e}.gate_proj.weight", True),
    "mlp.experts.w_up": ("mlp.experts.{e}.up_proj.weight", True),
    "mlp.experts.w_down": ("mlp.experts.{e}.down_proj.weight", True),
}
DEEPSEEK_V3_HF = StateDictAdapter(
    [NameRule(ours, hf, t) for ours, (hf, t) in TOP_MAP.items()]
    + layer_rules("decoder.layers.{i}.", "model.layers.{i}.", LAYER_MAP)
    + [StackedRule("decoder.layers.{i}." + ours, "model.layers.{i}." + hf, t) for ours, (hf, t) in EXPERT_MAP.items()]
    + mtp_rules(LAYER_MAP, EXPERT_MAP),          # the MTP layers: model.layers.{num_hidden_layers + k - 1} (mtp_names.py)
    fallbacks={"lm_head.weight": "model.embed_tokens.weight"},
    ignored=("model.layers.{i}.self_attn.rotary_emb.inv_freq",) + SHARED_COPIES)


class DeepseekV3HFConfig:
    """config.json <-> model_config for DeepseekV3ForCausalLM: the common and MoE keys through
    ``hf_to_model_config``, DeepSeek's own read here (``n_routed_experts``, ``n_shared_experts``,
    ``routed_scaling_factor``, ``n_group`` / ``topk_group``, ``first_k_dense_replace``, ``scoring_func``,
    ``topk_method``, the MLA sizes, ``rope_interleave``, YaRN in ``rope_scaling`` / ``rope_parameters``)."""
    architectures = ("DeepseekV3ForCausalLM",)
    model_type = "deepseek_v3"
    defaults = {"seq_length": 4096}
    OWN = {"n_routed_experts": "num_experts", "n_shared_experts": "n_shared_experts",
           "routed_scaling_factor": "routed_scaling_factor", "n_group": "n_group", "topk_group": "topk_group",
           "first_k_dense_replace": "first_k_dense_replace", "q_lora_rank": "q_lora_rank",
           "kv_lora_rank": "kv_lora_rank", "qk_nope_head_dim": "qk_nope_head_dim",
           "qk_rope_head_dim": "qk_rope_head_dim", "v_head_dim": "v_head_dim", "rope_interleave": "rope_interleave",
           "aux_loss_alpha": "moe_aux_loss_coeff"}
    # read and not used: derived sizes, DeepSeek's bookkeeping; MTP depth (num_nextn_predict_layers / transformers'
    # num_mtp_layers) is read by the MTP code where it applies
    SKIPPED = ("qk_head_dim", "head_dim", "ep_size", "moe_layer_freq", "seq_aux", "num_nextn_predict_layers",
               "num_mtp_layers", "num_key_value_heads", "pretraining_tp")
    _MAPPING = HFConfigMapping(("DeepseekV3ForCausalLM",), "deepseek_v3", moe=True, defaults={"seq_length": 4096})

    def read(self, hf: Mapping[str, Any], source: str = "config.json") -> Dict[str, Any]:
        hf = dict(hf)
        own = {key: hf.pop(key) for key in list(hf) if key in self.OWN}
        for key in self.SKIPPED:
            hf.pop(key, None)
        scoring = hf.pop("scoring_func", "sigmoid")
        method = hf.pop("topk_method", "noaux_tc")
        rope = None
        for key in ("rope_scaling", "rope_parameters"):
            value = hf.pop(key, None)
            if isinstance(value, Mapping) and value.get("rope_type", value.get("type", "default")) not in (None, "default"):
                rope = {k: v for k, v in value.items() if k not in ("rope_theta",)}
                if value.get("rope_theta") is not None:
                    hf.setdefault("rope_theta", value["rope_theta"])
            elif isinstance(value, Mapping) and value.get("rope_theta") is not None:
                hf.setdefault("rope_theta", value["rope_theta"])
            elif value is not None and not isinstance(value, Mapping):
                raise HFConfigError(f"{source}: {key} = {value!r}: must be an object (rope_type, rope_theta, ...)")
        hf["num_local_experts"] = own.get("n_routed_experts")
        out = hf_to_model_config(hf, self._MAPPING, source)
        for key, value in own.items():
            if key != "n_routed_experts" and value is not None:
                out[self.OWN[key]] = value
        if scoring not in ("sigmoid", "softmax"):
            raise HFConfigError(f"{source}: scoring_func = {scoring!r}: only sigmoid and softmax are implemented")
        if method not in ("noaux_tc", "greedy", "group_limited_greedy"):
            raise HFConfigError(f"{source}: topk_method = {method!r}: one of noaux_tc (expert bias), greedy, "
                                "group_limited_greedy")
        out["scoring_func"] = scoring
        out["moe_router_enable_expert_bias"] = method == "noaux_tc"
        if rope is not None:
            out["rope_scaling"] = rope
        return out

    def write(self, c) -> Dict[str, Any]:
        """A built DeepseekV3Config as config.json keys (transformers 5.x reads them)."""
        dense = [i for i in range(c.num_layers) if not c.is_moe_layer(i + 1)]
        if dense != list(range(len(dense))):
            raise ValueError(f"write_hf_config: DeepseekV3ForCausalLM's dense layers are the first "
                             f"first_k_dense_replace ones; this config has dense layers {dense}")
        expert = c.moe_ffn_hidden_size or c.ffn_hidden_size
        shared = c.moe_shared_expert_intermediate_size or 0
        if shared % expert:
            raise ValueError(f"write_hf_config: shared experts of width {shared} are not a whole number of experts "
                             f"of width {expert} (n_shared_experts)")
        rope = {"rope_type": "default", "rope_theta": float(c.rotary_base)}
        if c.rotary_scaling:
            rope = dict({k: v for k, v in c.rotary_scaling.items() if k != "type"}, rope_type="yarn",
                        rope_theta=float(c.rotary_base))
        return {
            "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
            "vocab_size": c.vocab_size, "hidden_size": c.hidden_size, "intermediate_size": c.ffn_hidden_size,
            "moe_intermediate_size": expert, "num_hidden_layers": c.num_layers,
            "num_attention_heads": c.num_attention_heads, "num_key_value_heads": c.num_attention_heads,
            "n_shared_experts": shared // expert, "n_routed_experts": c.num_moe_experts,
            "routed_scaling_factor": float(c.moe_router_topk_scaling_factor),
            "kv_lora_rank": c.kv_lora_rank, "q_lora_rank": c.q_lora_rank or None,
            "qk_rope_head_dim": c.qk_pos_emb_head_dim, "v_head_dim": c.v_head_dim, "qk_nope_head_dim": c.qk_head_dim,
            "n_group": c.moe_router_num_groups or 1, "topk_group": c.moe_router_group_topk or 1,
            "num_experts_per_tok": c.moe_router_topk, "first_k_dense_replace": len(dense),
            "norm_topk_prob": bool(c.moe_router_norm_topk_prob), "hidden_act": "silu",
            "scoring_func": c.moe_router_score_function,
            "topk_method": "noaux_tc" if c.moe_router_enable_expert_bias else "greedy",
            "max_position_embeddings": c.max_positions, "rms_norm_eps": c.layernorm_epsilon,
            "rope_parameters": rope, "rope_interleave": bool(c.rotary_interleaved),
            "tie_word_embeddings": bool(c.tie_word_embeddings), "attention_bias": False,
            "torch_dtype": c.params_dtype, "use_cache": True, "num_nextn_predict_layers": c.mtp_num_layers or 0,
        }


DEEPSEEK_V3_HF_CONFIG = DeepseekV3HFConfig()

register_model("DeepseekV3ForCausalLM", config_class=DeepseekV3Config, model_type="deepseek_v3", tokenizer="hf",
               layer_spec=deepseek_v3_layer_spec, state_dict_adapter=DEEPSEEK_V3_HF,
               hf_config=DEEPSEEK_V3_HF_CONFIG)(DeepseekV3ForCausalLM)

__all__ = ["DeepseekV3Config", "DeepseekV3ForCausalLM", "deepseek_v3_layer_spec", "DEEPSEEK_V3_HF",
           "DEEPSEEK_V3_HF_CONFIG", "DeepseekV3HFConfig", "MLA_KEYS"]
