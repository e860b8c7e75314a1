"""Llama's config: ``LlamaConfig`` (a ``TransformerConfig`` with Llama's defaults) and the mapping from
MindFormers' ``model.model_config`` keys (``num_heads``, ``n_kv_heads``, ``rms_norm_eps``,
``rope_theta``, ``hidden_act``, ...) to its fields.

The same keys serve the Llama-shaped families: Qwen2's q/k/v biases (``add_qkv_bias``) and Qwen3's
per-head q/k norm (``qk_layernorm``) are switches of this config, and the mixture-of-experts keys
(Qwen3-MoE / DeepSeek-V3 names) are read through the one MoE key table, ``models/moe_keys.py``.
Parallel sizes come from ``parallel_config`` once, when the config is built (never set afterwards).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

from ...transformer import TransformerConfig
from ..moe_keys import is_moe_key, moe_fields

# MindFormers model_config key -> TransformerConfig field (same value)
_RENAMED = {"num_layers": "num_layers", "hidden_size": "hidden_size", "ffn_hidden_size": "ffn_hidden_size",
            "num_heads": "num_attention_heads", "vocab_size": "vocab_size", "seq_length": "seq_length",
            "rms_norm_eps": "layernorm_epsilon", "rope_theta": "rotary_base",
            "tie_word_embeddings": "tie_word_embeddings", "compute_dtype": "compute_dtype",
            "param_init_dtype": "params_dtype", "offset": "offset", "add_qkv_bias": "add_qkv_bias",
            "qk_layernorm": "qk_layernorm", "head_dim": "kv_channels", "kv_channels": "kv_channels",
            "mtp_num_layers": "mtp_num_layers", "mtp_loss_scaling_factor": "mtp_loss_scaling_factor"}
# YaRN and DeepSeek's pairwise rope (transformer/yarn.py, rotary.py): any Llama-shaped family may use them
_RENAMED.update({"rope_scaling": "rotary_scaling", "rope_interleave": "rotary_interleaved"})
# multi-latent attention's sizes: DeepSeek-V3's (models/deepseek_v3); null (the schema's default) is no MLA
MLA_ONLY = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
            "multi_latent_attention")
_ACTIVATIONS = {"silu": "swiglu", "swiglu": "swiglu", "gelu": "gelu"}
# rotary tables are built for seq_length; use_flash_attention: the same attention computed unfused (CPU)
_IGNORED = ("type", "max_position_embeddings", "use_flash_attention", "pet_config",   # pet_config: LoRA, peft/
            # generation keys, read by run_mode predict (training/predict.py), not by the model
            "do_sample", "top_k", "top_p", "temperature", "repetition_penalty", "max_decode_length", "max_new_tokens",
            "min_new_tokens", "eos_token_id", "pad_token_id")


def llama_ffn_hidden_size(hidden_size: int, multiple_of: int = 256) -> int:
    """Llama's default MLP width: 2/3 of 4h, rounded up to a multiple of ``multiple_of``."""
    width = int(2 * 4 * hidden_size / 3)
    return multiple_of * ((width + multiple_of - 1) // multiple_of)


@dataclass
class LlamaConfig(TransformerConfig):
    """TransformerConfig with Llama defaults. ``offset`` is MindFormers' pipeline layer split
    (per-stage adjustments to num_layers // stages). ``qk_layernorm``: Qwen3's RMSNorm of each query and
    key head (over head_dim, one weight shared by the heads) before the rotary embedding;
    ``add_qkv_bias`` (TransformerConfig): Qwen2's biases on the q/k/v projections."""
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
        model_config = dict(model_config)
        kwargs = {}
        for key, value in model_config.items():
            if key in _IGNORED or is_moe_key(key) or (key in MLA_ONLY and value is None) \
                    or (key == "multi_latent_attention" and not value):
                continue
            if key in MLA_ONLY:
                raise ValueError(f"{cls.__name__}: model_config.{key}={value!r}: multi-latent attention is "
                                 "DeepseekV3ForCausalLM's (model.arch.type / architectures); this family has none")
            if key in _RENAMED and value is None:
                continue                        # null: the family's default (Qwen3's q/k norm, Qwen2's biases)
            if key in _RENAMED:
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
            else:
                raise ValueError(f"LlamaConfig: unknown model_config key {key!r}")
        kwargs.update(moe_fields(model_config, lambda: kwargs.get("ffn_hidden_size")
                                 or llama_ffn_hidden_size(kwargs["hidden_size"])))
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
