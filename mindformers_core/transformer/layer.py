"""One pre-norm transformer layer: x + attn(norm(x)), then + mlp(norm(.)), built from a LayerSpec.

``layer_number`` is the layer's global 1-based number in the whole model, also on a pipeline
stage that holds only some layers; its weights are drawn under the global name
``decoder.layers.<layer_number - 1>`` so they do not depend on how the model is split.
"""
from __future__ import annotations

from typing import Optional

from mindspore import nn, ops

from .attention import HeadNorm, SelfAttention
from .config import TransformerConfig
from .init import init_weights
from .mlp import MLP
from .moe import MoELayer
from .norm import build_norm
from .spec import AttentionSpec, LayerSpec


def gpt_layer_spec(config: TransformerConfig, layer_number: int, qk_norm: bool = False) -> LayerSpec:
    """The GPT/Llama layer: the config's norm, self-attention (with Qwen3's per-head q/k norm when
    ``qk_norm``), and a dense MLP -- or a mixture of experts for the layers ``config.is_moe_layer``
    names (all but the first ``moe_first_k_dense_layers`` of a MoE model)."""
    attention = AttentionSpec(q_norm=HeadNorm, k_norm=HeadNorm) if qk_norm else AttentionSpec()
    return LayerSpec(attention=attention, mlp=MoELayer if config.is_moe_layer(layer_number) else MLP)


def _norm(cls: Optional[type], config: TransformerConfig):
    return build_norm(config.hidden_size, config) if cls is None else cls(config.hidden_size, config)


class TransformerLayer(nn.Cell):
    """(b, s, h) -> (b, s, h); ((b, s, h), load-balancing loss) when its MLP returns one (``returns_aux``).

    ``position_ids`` / ``segment_ids`` (b, s), optional: the rotary angles and the causal mask come from
    them (see ``SelfAttention``); None keeps the positions 0..s-1 of one document per row."""

    def __init__(self, config: TransformerConfig, layer_number: int = 1, spec: Optional[LayerSpec] = None):
        super().__init__()
        if not isinstance(layer_number, int) or not 1 <= layer_number <= config.num_layers:
            raise ValueError(f"{type(self).__name__}: layer_number={layer_number!r} must be in "
                             f"[1, num_layers={config.num_layers}] (global, 1-based)")
        spec = gpt_layer_spec(config, layer_number) if spec is None else spec
        if not isinstance(spec, LayerSpec):
            raise TypeError(f"{type(self).__name__}: spec={spec!r} must be a LayerSpec")
        self.spec = spec
        self.layer_number = layer_number
        self.input_layernorm = _norm(spec.input_norm, config)
        attention = spec.attention.module or SelfAttention
        self.self_attention = attention(config, layer_number, spec.attention, **dict(spec.attention.options))
        self.pre_mlp_layernorm = _norm(spec.pre_mlp_norm, config)
        self.mlp = (spec.mlp or MLP)(config)
        self.returns_aux = bool(getattr(self.mlp, "returns_aux", False))
        self.dropout_p = config.hidden_dropout
        self.use_dropout = config.hidden_dropout > 0
        init_weights(self, f"decoder.layers.{layer_number - 1}", config.init_method_std)

    def construct(self, x, position_ids=None, segment_ids=None, cache_slots=None, kv_mask=None):
        if cache_slots is None:
            y = self.self_attention(self.input_layernorm(x), position_ids, segment_ids)
        else:       # generation against the attention's KV cache (transformer/kv_cache.py)
            y = self.self_attention(self.input_layernorm(x), position_ids, segment_ids, cache_slots, kv_mask)
        if self.use_dropout:
            y = ops.dropout(y, p=self.dropout_p, training=self.training)
        x = x + y
        if self.returns_aux:
            y, aux = self.mlp(self.pre_mlp_layernorm(x))
            if self.use_dropout:
                y = ops.dropout(y, p=self.dropout_p, training=self.training)
            return x + y, aux
        y = self.mlp(self.pre_mlp_layernorm(x))
        if self.use_dropout:
            y = ops.dropout(y, p=self.dropout_p, training=self.training)
        return x + y
