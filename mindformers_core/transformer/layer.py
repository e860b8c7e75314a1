"""One pre-norm transformer layer: x + attn(norm(x)), then + mlp(norm(.)).

``layer_number`` is the layer's global 1-based number in the whole model, also on a pipeline
stage that holds only some layers; its weights are drawn under the global name
``decoder.layers.<layer_number - 1>`` so they do not depend on how the model is split.
"""
from __future__ import annotations

from mindspore import nn, ops

from .attention import SelfAttention
from .config import TransformerConfig
from .init import init_weights
from .mlp import MLP
from .norm import build_norm


class TransformerLayer(nn.Cell):
    """(b, s, h) -> (b, s, h)."""

    def __init__(self, config: TransformerConfig, layer_number: int = 1):
        super().__init__()
        if not isinstance(layer_number, int) or not 1 <= layer_number <= config.num_layers:
            raise ValueError(f"{type(self).__name__}: layer_number={layer_number!r} must be in "
                             f"[1, num_layers={config.num_layers}] (global, 1-based)")
        self.layer_number = layer_number
        self.input_layernorm = build_norm(config.hidden_size, config)
        self.self_attention = SelfAttention(config, layer_number)
        self.pre_mlp_layernorm = build_norm(config.hidden_size, config)
        self.mlp = self.build_mlp(config)
        self.dropout_p = config.hidden_dropout
        self.use_dropout = config.hidden_dropout > 0
        init_weights(self, f"decoder.layers.{layer_number - 1}", config.init_method_std)

    def build_mlp(self, config: TransformerConfig) -> nn.Cell:
        """The layer's MLP (a subclass swaps it, e.g. for a mixture of experts)."""
        return MLP(config)

    def construct(self, x):
        y = self.self_attention(self.input_layernorm(x))
        if self.use_dropout:
            y = ops.dropout(y, p=self.dropout_p, training=self.training)
        x = x + y
        y = self.mlp(self.pre_mlp_layernorm(x))
        if self.use_dropout:
            y = ops.dropout(y, p=self.dropout_p, training=self.training)
        return x + y
