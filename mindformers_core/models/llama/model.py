"""Llama's model (RMSNorm, SwiGLU, RoPE, grouped-query attention) on mindformers_core.transformer.

Model code only: ``LlamaForCausalLM`` is a ``GPTModel`` built from ``llama_layer_spec``.
Parallelism is applied from outside by the sharding pass, from the parallel sizes in the config.
"""
from __future__ import annotations

from typing import Optional, Sequence

from ...transformer import GPTModel, LayerSpec, TransformerConfig, gpt_layer_spec
from .config import LlamaConfig


def llama_layer_spec(config: TransformerConfig, layer_number: int) -> LayerSpec:
    """Llama's layer: RMSNorm, GQA self-attention (Qwen3's per-head q/k norm with ``qk_layernorm``),
    SwiGLU MLP, or a mixture of experts in the MoE layers of a MoE config (Qwen3-MoE, DeepSeek-style)."""
    return gpt_layer_spec(config, layer_number, qk_norm=bool(getattr(config, "qk_layernorm", False)))


class LlamaForCausalLM(GPTModel):
    """``construct(input_ids, labels=None)`` -> loss (labels given) or logits (b, s, vocab)."""

    def __init__(self, config: LlamaConfig, pre_process: Optional[bool] = None, post_process: Optional[bool] = None,
                 pp_rank: int = 0, vp_stage: Optional[int] = None, layers_per_stage: Optional[Sequence] = None):
        if layers_per_stage is None and isinstance(config, LlamaConfig):
            layers_per_stage = config.layers_per_stage()   # MindFormers' offset
        super().__init__(config, pre_process, post_process, llama_layer_spec, pp_rank, vp_stage, layers_per_stage)
