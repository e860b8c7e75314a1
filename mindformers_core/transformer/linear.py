"""Column- and row-parallel linear layers: plain ``x @ W (+ b)`` Cells that only *declare* a split.

They hold the full weight ``(input_size, output_size)`` (MindSpore's ``x @ W`` convention) and
contain no communication. The sharding pass treats each as one ``linear`` op (``sharding_op``),
replaces ``weight``/``bias`` by their local shards and inserts whatever redistribution the
declared layouts need: Column splits the output features over ``tp``; Row splits the input
features over ``tp`` and returns a (partial-summed, then reduced or reduce-scattered) result.
"""
from __future__ import annotations

from mindspore import nn, ops

from .config import TransformerConfig
from .init import constant_parameter, normal_parameter


class _Linear(nn.Cell):
    """``y = x @ weight + bias`` over any leading dims, computed in ``config.compute_dtype``."""
    sharding_op = "linear"
    sharding_params = ("weight", "bias")
    normal_init_params = ("weight",)

    def __init__(self, input_size: int, output_size: int, config: TransformerConfig, bias: bool = False,
                 init_std: float = None):
        super().__init__()
        self.input_size, self.output_size = input_size, output_size
        dtype = config.ms_params_dtype
        std = config.init_method_std if init_std is None else init_std
        self.init_std = std
        self.weight = normal_parameter(f"{type(self).__name__}:{input_size}x{output_size}",
                                       (input_size, output_size), std, dtype, "weight")
        self.bias = constant_parameter(0.0, (output_size,), dtype, "bias") if bias else None
        self.has_bias = bool(bias)
        self.compute_dtype = config.ms_compute_dtype
        self.need_cast = config.params_dtype != config.compute_dtype
        self.matmul = ops.MatMul()

    def sharding_attrs(self) -> dict:
        return {"transpose_b": False}

    def construct(self, x):
        weight = self.weight
        if self.need_cast:
            x = ops.cast(x, self.compute_dtype)
            weight = ops.cast(weight, self.compute_dtype)
        out = self.matmul(x.reshape(-1, x.shape[-1]), weight)
        if self.has_bias:
            bias = self.bias
            if self.need_cast:
                bias = ops.cast(bias, self.compute_dtype)
            out = out + bias
        return out.reshape(x.shape[:-1] + (-1,))

    def extend_repr(self) -> str:
        return f"input_size={self.input_size}, output_size={self.output_size}, bias={self.has_bias}"


class ColumnParallelLinear(_Linear):
    """Output features split over ``tp``; input and output activations are left to propagation."""

    def shard(self, config: TransformerConfig):
        L = config.layout
        weights = {"weight": L("None", "tp")}
        if self.has_bias:
            weights["bias"] = L("tp")
        return None, None, weights


class RowParallelLinear(_Linear):
    """Input features split over ``tp``: each rank multiplies its slice, the partial sums are
    reduced into a full (or, with sequence parallel, sequence-split) output."""

    def shard(self, config: TransformerConfig):
        L = config.layout
        weights = {"weight": L("tp", "None")}
        if self.has_bias:
            weights["bias"] = L("None")
        return L("dp", "cp", "tp"), sequence_parallel_layout(config), weights


def sequence_parallel_layout(config: TransformerConfig):
    """Layout of a (b, s, h) activation between tensor-parallel regions: sequence split over cp,
    and also over tp when ``sequence_parallel`` (cp outermost)."""
    L = config.layout
    if config.sequence_parallel:
        return L("dp", ("cp", "tp"), "None")
    return L("dp", "cp", "None")
