"""Llama (RMSNorm, SwiGLU, RoPE, grouped-query attention) on mindformers_core.transformer.

Model code only: ``LlamaForCausalLM`` is a ``GPTModel`` with Llama's choices, and ``LlamaConfig``
is a ``TransformerConfig`` that also reads MindFormers' ``model.model_config`` keys
(``num_heads``, ``n_kv_heads``, ``rms_norm_eps``, ``rope_theta``, ``hidden_act``, ...).
Parallelism is applied from outside by the sharding pass, from the parallel sizes in the config.
Registered as ``model.arch.type: LlamaForCausalLM`` (``mindformers_core.models.registry``); its
YAMLs and the Hugging Face weight converter stay in ``research/llama/``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

from ..transformer import GPTModel, LayerSpec, TransformerConfig, gpt_layer_spec
from .registry import register_model

# MindFormers model_config key -> TransformerConfig field (same value)
_RENAMED = {"num_layers": "num_layers", "hidden_size": "hidden_size", "ffn_hidden_size": "ffn_hidden_size",
            "num_heads": "num_attention_heads", "vocab_size": "vocab_size", "seq_length": "seq_length",
            "rms_norm_eps": "layernorm_epsilon", "rope_theta": "rotary_base",
            "tie_word_embeddings": "tie_word_embeddings", "compute_dtype": "compute_dtype",
            "param_init_dtype": "params_dtype", "offset": "offset", "add_qkv_bias": "add_qkv_bias",
            "qk_layernorm": "qk_layernorm"}
# Mixture-of-experts keys (Qwen3-MoE / DeepSeek-V3 names as the trainer's schema holds them; the DeepSeek
# moe_config block is translated to these in training/dialects.py) -> TransformerConfig field
MOE_KEYS = {"num_experts": "num_moe_experts", "n_routed_experts": "num_moe_experts",
            "num_experts_per_tok": "moe_router_topk", "moe_router_topk": "moe_router_topk",
            "moe_intermediate_size": "moe_ffn_hidden_size", "moe_ffn_hidden_size": "moe_ffn_hidden_size",
            "moe_shared_expert_intermediate_size": "moe_shared_expert_intermediate_size",
            "first_k_dense_replace": "moe_first_k_dense_layers", "routed_scaling_factor": "moe_router_topk_scaling_factor",
            "scoring_func": "moe_router_score_function", "norm_topk_prob": "moe_router_norm_topk_prob",
            "n_group": "moe_router_num_groups", "topk_group": "moe_router_group_topk",
            "moe_router_enable_expert_bias": "moe_router_enable_expert_bias",
            "moe_router_bias_update_rate": "moe_router_bias_update_rate", "moe_aux_loss_coeff": "moe_aux_loss_coeff",
            "moe_router_load_balancing_type": "moe_router_load_balancing_type",
            "moe_expert_capacity_factor": "moe_expert_capacity_factor", "moe_token_drop_policy": "moe_token_drop_policy"}
_ACTIVATIONS = {"silu": "swiglu", "swiglu": "swiglu", "gelu": "gelu"}
_IGNORED = ("type", "max_position_embeddings")   # rotary tables are built for seq_length


def llama_ffn_hidden_size(hidden_size: int, multiple_of: int = 256) -> int:
    """Llama's default MLP width: 2/3 of 4h, rounded up to a multiple of ``multiple_of``."""
    width = int(2 * 4 * hidden_size / 3)
    return multiple_of * ((width + multiple_of - 1) // multiple_of)


@dataclass
class LlamaConfig(TransformerConfig):
    """TransformerConfig with Llama defaults. ``offset`` is MindFormers' pipeline layer split
    (per-stage adjustments to num_layers // stages). ``qk_layernorm``: Qwen3's RMSNorm of each query and
    key head (over head_dim, one weight shared by the heads) before the rotary embedding."""
    normalization: str = "RMSNorm"
    activation: str = "swiglu"
    position_embedding_type: str = "rope"
    offset: Any = 0
    qk_layernorm: bool = False

    def __post_init__(self):
        if self.ffn_hidden_size is None and isinstance(self.hidden_size, int):
            self.ffn_hidden_size = llama_ffn_hidden_size(self.hidden_size)
        super().__post_init__()
        self.layers_per_stage()   # validates offset

    @classmethod
    def from_model_config(cls, model_config: Mapping[str, Any], parallel_config: Optional[Mapping[str, Any]] = None,
                          pipeline_interleave: int = 1) -> "LlamaConfig":
        """From a MindFormers ``model.model_config`` mapping (and ``parallel_config``)."""
        kwargs = {}
        shared_experts = None
        for key, value in dict(model_config).items():
            if key in _IGNORED:
                continue
            if key in MOE_KEYS:
                if value is not None:
                    kwargs[MOE_KEYS[key]] = value
            elif key == "n_shared_experts":
                shared_experts = value
            elif key in _RENAMED:
                kwargs[_RENAMED[key]] = value
            elif key == "hidden_act":
                if value not in _ACTIVATIONS:
                    raise ValueError(f"LlamaConfig: model_config.hidden_act={value!r}; supported: "
                                     f"{sorted(_ACTIVATIONS)} (silu means the gated SwiGLU MLP)")
                kwargs["activation"] = _ACTIVATIONS[value]
            elif key in ("n_kv_heads", "num_query_groups"):
                if value is not None and kwargs.get("num_query_groups") not in (None, value):
                    raise ValueError(f"LlamaConfig: model_config.n_kv_heads and num_query_groups disagree "
                                     f"({kwargs['num_query_groups']} vs {value}); give at most one")
                if value is not None:
                    kwargs["num_query_groups"] = value
            elif key == "use_flash_attention":
                if value:
                    raise ValueError("LlamaConfig: model_config.use_flash_attention=True: there is no fused "
                                     "attention kernel here (CPU); set it to False")
            else:
                raise ValueError(f"LlamaConfig: unknown model_config key {key!r}")
        if kwargs.get("num_moe_experts") is not None and kwargs["num_moe_experts"] <= 1:
            kwargs = {k: v for k, v in kwargs.items() if k not in MOE_KEYS.values()}    # one expert: dense
        if shared_experts and kwargs.get("num_moe_experts") is not None:
            if kwargs.get("moe_shared_expert_intermediate_size") is None:
                width = kwargs.get("moe_ffn_hidden_size") or kwargs.get("ffn_hidden_size") or \
                    llama_ffn_hidden_size(kwargs["hidden_size"])
                kwargs["moe_shared_expert_intermediate_size"] = int(shared_experts) * int(width)
        pc = dict(parallel_config or {})
        kwargs.update(data_parallel_size=pc.get("data_parallel", 1),
                      tensor_model_parallel_size=pc.get("model_parallel", 1),
                      pipeline_model_parallel_size=pc.get("pipeline_stage", 1),
                      context_parallel_size=pc.get("context_parallel", 1),
                      sequence_parallel=bool(pc.get("use_seq_parallel", False)),
                      expert_model_parallel_size=pc.get("expert_parallel", 1) or 1,
                      virtual_pipeline_model_parallel_size=pipeline_interleave if pipeline_interleave > 1 else None)
        return cls(**kwargs)

    def layers_per_stage(self):
        """MindFormers ``offset`` as layer counts per stage (None = uniform split)."""
        stages = self.pipeline_model_parallel_size * (self.virtual_pipeline_model_parallel_size or 1)
        offset = self.offset
        if isinstance(offset, int) and not isinstance(offset, bool):
            offset = [offset] * stages if offset else None
        if offset is None:
            return None
        if not isinstance(offset, (list, tuple)) or len(offset) != stages:
            raise ValueError(f"LlamaConfig: offset={self.offset!r} must be an int or a list of {stages} ints "
                             f"(one per pipeline stage)")
        base = self.num_layers // stages
        counts = [base + int(o) for o in offset]
        if sum(counts) != self.num_layers or min(counts) < 0:
            raise ValueError(f"LlamaConfig: offset={self.offset!r} gives layer counts {counts} that do not sum to "
                             f"num_layers={self.num_layers} (offsets must sum to num_layers % stages = "
                             f"{self.num_layers % stages})")
        return counts


def llama_layer_spec(config: TransformerConfig, layer_number: int) -> LayerSpec:
    """Llama's layer: RMSNorm, GQA self-attention (Qwen3's per-head q/k norm with ``qk_layernorm``),
    SwiGLU MLP, or a mixture of experts in the MoE layers of a MoE config (Qwen3-MoE, DeepSeek-style)."""
    return gpt_layer_spec(config, layer_number, qk_norm=bool(getattr(config, "qk_layernorm", False)))


@register_model("LlamaForCausalLM", config_class=LlamaConfig, model_type="llama")
class LlamaForCausalLM(GPTModel):
    """``construct(input_ids, labels=None)`` -> loss (labels given) or logits (b, s, vocab)."""

    def __init__(self, config: LlamaConfig, pre_process: Optional[bool] = None, post_process: Optional[bool] = None,
                 pp_rank: int = 0, vp_stage: Optional[int] = None, layers_per_stage: Optional[Sequence] = None):
        if layers_per_stage is None and isinstance(config, LlamaConfig):
            layers_per_stage = config.layers_per_stage()   # MindFormers' offset
        super().__init__(config, pre_process, post_process, llama_layer_spec, pp_rank, vp_stage, layers_per_stage)
