"""RMSNorm and LayerNorm over the hidden (last) dim, computed in float32.

Each is one ``rms_norm`` / ``layer_norm`` op for the sharding pass: the hidden dim must be whole,
every other dim may stay split. With sequence parallel they declare the sequence-split layout so
the norm runs on 1/tp of the tokens between the tensor-parallel regions.
"""
from __future__ import annotations

import mindspore as ms
from mindspore import nn, ops

from .config import TransformerConfig
from .init import constant_parameter
from .linear import sequence_parallel_layout


class _Norm(nn.Cell):
    sharding_params = ("weight",)

    def __init__(self, hidden_size: int, config: TransformerConfig, eps: float = None):
        super().__init__()
        self.hidden_size = hidden_size
        self.eps = float(config.layernorm_epsilon if eps is None else eps)
        self.weight = constant_parameter(1.0, (hidden_size,), config.ms_params_dtype, "weight")
        self.need_cast = config.compute_dtype != "float32" or config.params_dtype != "float32"

    def sharding_attrs(self) -> dict:
        return {"epsilon": self.eps}

    def shard(self, config: TransformerConfig):
        if not config.sequence_parallel:
            return None, None, None
        layout = sequence_parallel_layout(config)
        return layout, layout, None

    def extend_repr(self) -> str:
        return f"hidden_size={self.hidden_size}, eps={self.eps}"


class RMSNorm(_Norm):
    """``x / sqrt(mean(x^2) + eps) * weight``."""
    sharding_op = "rms_norm"

    def construct(self, x):
        if self.need_cast:
            dtype = x.dtype
            x = ops.cast(x, ms.float32)
            y = x * ops.rsqrt(ops.mean(x * x, -1, keep_dims=True) + self.eps)
            return ops.cast(y * ops.cast(self.weight, ms.float32), dtype)
        return x * ops.rsqrt(ops.mean(x * x, -1, keep_dims=True) + self.eps) * self.weight


class LayerNorm(_Norm):
    """``(x - mean) / sqrt(var + eps) * weight + bias`` (MindSpore's fused LayerNorm kernel, about
    twice as fast on CPU as the composite formula; the cell is atomic, so that is invisible)."""
    sharding_op = "layer_norm"
    sharding_params = ("weight", "bias")

    def __init__(self, hidden_size: int, config: TransformerConfig, eps: float = None):
        super().__init__(hidden_size, config, eps)
        self.bias = constant_parameter(0.0, (hidden_size,), config.ms_params_dtype, "bias")
        self.layer_norm = ops.LayerNorm(begin_norm_axis=-1, begin_params_axis=-1, epsilon=self.eps)

    def construct(self, x):
        if self.need_cast:
            dtype = x.dtype
            y, _, _ = self.layer_norm(ops.cast(x, ms.float32), ops.cast(self.weight, ms.float32),
                                      ops.cast(self.bias, ms.float32))
            return ops.cast(y, dtype)
        y, _, _ = self.layer_norm(x, self.weight, self.bias)
        return y


def build_norm(hidden_size: int, config: TransformerConfig):
    """The norm named by ``config.normalization``."""
    cls = RMSNorm if config.normalization == "RMSNorm" else LayerNorm
    return cls(hidden_size, config, config.layernorm_epsilon)
