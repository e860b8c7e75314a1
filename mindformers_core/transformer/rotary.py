"""Rotary position embedding (RoPE), rotate-half convention (Llama / Hugging Face), optionally over
interleaved channel pairs (``config.rotary_interleaved``, DeepSeek) and YaRN-scaled (``config.rotary_scaling``,
``transformer/yarn.py``).

``RotaryEmbedding`` holds constant cos/sin tables for ``config.seq_length`` positions, shaped
(s, 1, head_dim) so they broadcast over (b, s, heads, head_dim). With ``rotary_percent < 1``
only the first channels rotate: the tables hold cos = 1, sin = 0 for the rest, which keeps them
broadcastable to x (what the ``rotary_embedding`` sharding rule expects). The cell is one op for
the sharding pass; when the sequence is split, the pass slices the tables like x. Row i holds the
angles of the token's true global position (``config.token_positions()``: the identity, except in
the storage order of load-balanced context parallelism).
"""
from __future__ import annotations

import numpy as np
import mindspore as ms
from mindspore import Tensor, nn, ops

from .config import TransformerConfig
from .yarn import yarn_attention_factor, yarn_inv_freq


def rotary_tables(seq_length: int, head_dim: int, rotary_dim: int, base: float, positions=None, scaling=None):
    """(cos, sin) as float32 arrays of shape (seq_length, 1, head_dim); row i is for the token at
    global position ``positions[i]`` (default: i). ``scaling``: a YaRN setting (``transformer/yarn.py``):
    its blended frequencies, and the tables times its attention factor."""
    if scaling:
        inv_freq, factor = yarn_inv_freq(rotary_dim, base, scaling), yarn_attention_factor(scaling)
    else:
        inv_freq, factor = 1.0 / (base ** (np.arange(0, rotary_dim, 2, dtype=np.float64) / rotary_dim)), 1.0
    pos = np.arange(seq_length) if positions is None else np.asarray(positions)
    freqs = np.outer(pos.astype(np.float64), inv_freq)
    angles = np.concatenate([freqs, freqs], axis=-1)
    cos = np.ones((seq_length, head_dim))
    sin = np.zeros((seq_length, head_dim))
    cos[:, :rotary_dim], sin[:, :rotary_dim] = np.cos(angles) * factor, np.sin(angles) * factor
    return cos[:, None, :].astype(np.float32), sin[:, None, :].astype(np.float32)


def rotate(x, cos, sin, half: int, rotary_dim: int, partial: bool, low_precision: bool, interleaved: bool = False):
    """``x * cos + rotate_half(x) * sin`` over the first ``rotary_dim`` channels of x's last dim.
    ``interleaved``: the rotated pairs are channels (0, 1), (2, 3), ... (DeepSeek's checkpoints); they are
    gathered into halves first (evens, then odds), so the output holds each pair's two results half apart --
    the same permutation for q and k, which leaves every q.k product as the interleaved rotation gives it."""
    dtype = x.dtype
    if low_precision:
        x = ops.cast(x, ms.float32)
    if interleaved:
        pairs = ops.cat((x[:, :, :, 0:rotary_dim:2], x[:, :, :, 1:rotary_dim:2]), -1)
        x = ops.cat((pairs, x[:, :, :, rotary_dim:]), -1) if partial else pairs
    x1 = x[:, :, :, :half]
    x2 = x[:, :, :, half:rotary_dim]
    if partial:
        rotated = ops.cat((-x2, x1, x[:, :, :, rotary_dim:]), -1)
    else:
        rotated = ops.cat((-x2, x1), -1)
    out = x * cos + rotated * sin
    if low_precision:
        out = ops.cast(out, dtype)
    return out


class _Rotary(nn.Cell):
    """The channel split both rotary Cells share."""

    def __init__(self, config: TransformerConfig, dim: int = None):
        super().__init__()
        self.head_dim = config.head_dim if dim is None else dim
        self.rotary_dim = int(config.head_dim * config.rotary_percent) if dim is None else dim
        self.half = self.rotary_dim // 2
        self.partial = self.rotary_dim < self.head_dim
        self.low_precision = config.compute_dtype != "float32"   # rotate in float32 either way
        self.interleaved = bool(config.rotary_interleaved)
        self.scaling = config.rotary_scaling

    def sharding_attrs(self) -> dict:
        return {}

    def shard(self, config: TransformerConfig):
        return None, None, None


class RotaryEmbedding(_Rotary):
    """``apply_rotary(x) = x * cos + rotate_half(x) * sin`` for x of shape (b, s, heads, head_dim);
    requires s == seq_length (the tables' length). ``dim``: rotate x's whole last dim of this size instead of
    ``config.head_dim * rotary_percent`` (multi-latent attention's rotary part)."""
    sharding_op = "rotary_embedding"
    sharding_params = ("cos", "sin")

    def __init__(self, config: TransformerConfig, dim: int = None):
        super().__init__(config, dim)
        cos, sin = rotary_tables(config.seq_length, self.head_dim, self.rotary_dim, config.rotary_base,
                                 config.token_positions(), self.scaling)
        self.cos, self.sin = Tensor(cos), Tensor(sin)

    def construct(self, x):
        return self.apply_rotary(x)

    def apply_rotary(self, x):
        return rotate(x, self.cos, self.sin, self.half, self.rotary_dim, self.partial, self.low_precision,
                      self.interleaved)


class PositionRotary(_Rotary):
    """``(x (b, s, heads, head_dim), position_ids (b, s)) -> x`` rotated by each token's own position:
    the rows of (max_positions, 1, head_dim) tables picked by ``position_ids``. One op for the sharding
    pass (``rotary_embedding_by_position``): x and the positions split alike, the tables whole."""
    sharding_op = "rotary_embedding_by_position"
    sharding_params = ("cos", "sin")

    def __init__(self, config: TransformerConfig, dim: int = None):
        super().__init__(config, dim)
        cos, sin = rotary_tables(config.max_positions, self.head_dim, self.rotary_dim, config.rotary_base,
                                 scaling=self.scaling)
        self.cos, self.sin = Tensor(cos), Tensor(sin)

    def construct(self, x, position_ids):
        ids = ops.cast(position_ids, ms.int32)
        cos = ops.gather(self.cos[:, 0, :], ids, 0)     # (b, s, head_dim)
        sin = ops.gather(self.sin[:, 0, :], ids, 0)
        return rotate(x, ops.expand_dims(cos, 2), ops.expand_dims(sin, 2), self.half, self.rotary_dim,
                      self.partial, self.low_precision, self.interleaved)
