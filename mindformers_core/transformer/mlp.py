"""The feed-forward block: column-parallel up projection(s), activation, row-parallel down.

SwiGLU (Llama) uses two column-parallel projections, ``linear_fc1_gate`` and ``linear_fc1_up``,
rather than one fused (h, 2f) weight: each then splits over tp by plain column slicing, and every
rank holds matching gate/up halves without any weight re-ordering.
"""
from __future__ import annotations

from mindspore import nn, ops

from .config import TransformerConfig
from .linear import ColumnParallelLinear, RowParallelLinear


class SwiGLU(nn.Cell):
    """silu(gate) * up."""

    def construct(self, gate, up):
        return ops.silu(gate) * up


class GELU(nn.Cell):
    """Exact (erf) GELU."""

    def construct(self, x):
        return ops.gelu(x)


class MLP(nn.Cell):
    """(b, s, h) -> (b, s, h) with ``config.activation`` ("swiglu" or "gelu")."""

    def __init__(self, config: TransformerConfig):
        super().__init__()
        h, f, bias = config.hidden_size, config.ffn_hidden_size, config.add_bias_linear
        self.gated = config.activation == "swiglu"
        if self.gated:
            self.linear_fc1_gate = ColumnParallelLinear(h, f, config, bias=bias)
            self.linear_fc1_up = ColumnParallelLinear(h, f, config, bias=bias)
            self.act = SwiGLU()
        else:
            self.linear_fc1 = ColumnParallelLinear(h, f, config, bias=bias)
            self.act = GELU()
        self.linear_fc2 = RowParallelLinear(f, h, config, bias=bias)

    def construct(self, x):
        if self.gated:
            y = self.act(self.linear_fc1_gate(x), self.linear_fc1_up(x))
        else:
            y = self.act(self.linear_fc1(x))
        return self.linear_fc2(y)
