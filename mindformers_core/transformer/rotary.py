"""Rotary position embedding (RoPE), rotate-half convention (Llama / Hugging Face), optionally over
interleaved channel pairs (``config.rotary_interleaved``, DeepSeek) and YaRN-scaled (``config.rotary_scaling``,
``transformer/yarn.py``).

``RotaryEmbedding`` rotates x (b, s, heads, head_dim) by the angles of positions 0..s-1, for any length s up
to ``config.max_positions``: constant cos/sin tables shaped (rows, 1, head_dim) broadcast over x, and a
shorter input takes their first s rows (a static slice, also under ``ms.jit``). With ``rotary_percent < 1``
only the first channels rotate: the tables hold cos = 1, sin = 0 for the rest, which keeps them broadcastable
to x (what the ``rotary_embedding`` sharding rule expects). The cell is one op for the sharding pass with the
``seq_length`` tables ``cos``/``sin`` as its parameters; when the sequence is split, the pass slices them like
x.

**One copy per model.** The tables are constants, the same for every layer: :func:`shared_rotary_tables` gives
the same Tensor objects to every Cell that asks for the same tables (while any of them lives), so a model of
28 layers holds one ``seq_length`` pair and one ``max_positions`` pair, not 28 x 4 of them. The exception is
context parallelism (``context_parallel_size > 1``): each Cell keeps its own ``seq_length`` tables in the
sequence's storage order (row i for the token's true global position ``config.token_positions()[i]``),
because the sharding pass replaces each Cell's tables by its rank's rows; the input must then have exactly
``seq_length`` tokens.
"""
from __future__ import annotations

import weakref

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


# (rows, head_dim, rotary_dim, base, scaling, which) -> the Tensor every Cell asking for these tables holds
_SHARED = weakref.WeakValueDictionary()


def _scaling_key(scaling):
    if not scaling:
        return None
    return tuple(sorted((str(k), repr(v)) for k, v in dict(scaling).items()))


def shared_rotary_tables(rows: int, head_dim: int, rotary_dim: int, base: float, scaling=None):
    """``rotary_tables`` of positions 0..rows-1 as (cos, sin) Tensors, the same objects for the same arguments
    while any Cell holds them: the model's layers share one copy (read-only constants)."""
    key = (int(rows), int(head_dim), int(rotary_dim), float(base), _scaling_key(scaling))
    cos, sin = _SHARED.get(key + ("cos",)), _SHARED.get(key + ("sin",))
    if cos is None or sin is None:
        c, s = rotary_tables(rows, head_dim, rotary_dim, base, scaling=scaling)
        cos, sin = Tensor(c), Tensor(s)
        _SHARED[key + ("cos",)], _SHARED[key + ("sin",)] = cos, sin
    return cos, sin


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
    """``apply_rotary(x) = x * cos + rotate_half(x) * sin`` for x of shape (b, s, heads, head_dim) at positions
    0..s-1, any s up to ``config.max_positions`` (a ``ValueError`` past it). ``cos``/``sin``: the
    ``seq_length`` tables (the sharding pass's parameters); ``cos_all``/``sin_all``: the ``max_positions``
    ones another length takes its rows from (both shared by the model's layers; with context parallelism
    ``cos``/``sin`` are the Cell's own, in storage order, and only s = seq_length is accepted). ``dim``:
    rotate x's whole last dim of this size instead of ``config.head_dim * rotary_percent`` (multi-latent
    attention's rotary part)."""
    sharding_op = "rotary_embedding"
    sharding_params = ("cos", "sin")

    def __init__(self, config: TransformerConfig, dim: int = None):
        super().__init__(config, dim)
        self.seq_length, self.limit = config.seq_length, config.max_positions
        self.cp = config.context_parallel_size
        if self.cp > 1:         # storage order, the Cell's own: the pass gives each Cell its rank's rows
            cos, sin = rotary_tables(config.seq_length, self.head_dim, self.rotary_dim, config.rotary_base,
                                     config.token_positions(), self.scaling)
            self.cos, self.sin = Tensor(cos), Tensor(sin)
            self.cos_all = self.sin_all = None
        else:
            self.cos, self.sin = shared_rotary_tables(config.seq_length, self.head_dim, self.rotary_dim,
                                                      config.rotary_base, self.scaling)
            self.cos_all, self.sin_all = shared_rotary_tables(config.max_positions, self.head_dim, self.rotary_dim,
                                                              config.rotary_base, self.scaling)

    def construct(self, x):
        return self.apply_rotary(x)

    def apply_rotary(self, x):
        cos, sin = self.tables(x.shape[1])
        return rotate(x, cos, sin, self.half, self.rotary_dim, self.partial, self.low_precision,
                      self.interleaved)

    def tables(self, s: int):
        """The (s, 1, head_dim) cos and sin of positions 0..s-1 (s: x's static sequence length)."""
        if s == self.cos.shape[0]:
            return self.cos, self.sin
        if self.cp > 1:
            raise ValueError(f"RotaryEmbedding: an input of {s} tokens with context_parallel_size={self.cp}: "
                             f"context parallelism keeps the sequence in its storage order of exactly "
                             f"seq_length={self.seq_length} tokens ({self.cos.shape[0]} on this rank); give "
                             f"inputs of seq_length tokens (pad them), or use context_parallel_size=1")
        if s > self.limit:
            raise ValueError(f"RotaryEmbedding: an input of {s} tokens is past the model's position limit "
                             f"max_positions={self.limit} (max_position_embeddings, at least seq_length)")
        return self.cos_all[:s], self.sin_all[:s]


class PositionRotary(_Rotary):
    """``(x (b, s, heads, head_dim), position_ids (b, s)) -> x`` rotated by each token's own position:
    the rows of (max_positions, 1, head_dim) tables picked by ``position_ids`` (shared by the model's layers).
    One op for the sharding pass (``rotary_embedding_by_position``): x and the positions split alike, the
    tables whole."""
    sharding_op = "rotary_embedding_by_position"
    sharding_params = ("cos", "sin")

    def __init__(self, config: TransformerConfig, dim: int = None):
        super().__init__(config, dim)
        self.cos, self.sin = shared_rotary_tables(config.max_positions, self.head_dim, self.rotary_dim,
                                                  config.rotary_base, self.scaling)

    def construct(self, x, position_ids):
        ids = ops.cast(position_ids, ms.int32)
        # rows gathered from the (P, 1, d) tables as they are, (b, s, 1, d): slicing a table to (P, d) first
        # would copy the whole table at every call
        cos = ops.gather(self.cos, ids, 0)
        sin = ops.gather(self.sin, ids, 0)
        return rotate(x, cos, sin, self.half, self.rotary_dim, self.partial, self.low_precision, self.interleaved)
