"""Causal self-attention with grouped-query attention (GQA) and rotary positions.

Positions are inputs: without ``position_ids`` a row is one document at positions 0..s-1, for any
length s up to ``config.max_positions``: the rotary angles are the first s rows of constant tables the
model's layers share (``rotary.py``) and the causal mask is built in the graph from s (no layer holds a
seq_length^2 constant); with context parallelism both are in the sequence's storage order and s must be
``seq_length``. With ``position_ids`` (and optionally ``segment_ids``) of shape (b, s) the rotary angles
are looked up per token and the mask is built per row: a query sees the keys of its own segment at
positions not after its own (packed documents never see each other).

Written for one card, and correct unchanged on tensor-parallel shards: head counts are never
baked in (reshapes use -1 for the heads dim, so a rank holding heads/tp heads just sees fewer),
and the GQA repeat factor heads // groups is the same on every rank. Everything outside the
projection, rotary and norm cells is plain matmul / transpose / reshape / softmax / arithmetic,
which the sharding pass follows op by op.
"""
from __future__ import annotations

import math
import weakref

import numpy as np
import mindspore as ms
from mindspore import Tensor, nn, ops

from ..common.sequence_placement import causal_mask_array
from .config import TransformerConfig
from .linear import ColumnParallelLinear, RowParallelLinear
from .norm import RMSNorm
from .rotary import PositionRotary, RotaryEmbedding
from .spec import AttentionSpec

MASK_VALUE = -1.0e9


def causal_mask(seq_length: int, positions=None) -> Tensor:
    """Additive float32 mask (1, 1, s, s): -1e9 where the key's position is after the query's
    (above the diagonal for the default positions 0..s-1), 0 elsewhere."""
    pos = np.arange(seq_length) if positions is None else positions
    return Tensor(causal_mask_array(pos, MASK_VALUE)[None, None])


def causal_mask_of_length(s: int):
    """``causal_mask(s)`` computed in the graph from the static length s (keys after the query: MASK_VALUE)."""
    pos = ops.arange(s, dtype=ms.int32)
    allowed = ops.expand_dims(pos, 0) <= ops.expand_dims(pos, 1)          # (query, key): key not after query
    mask = ops.select(allowed, ops.zeros((s, s), ms.float32), ops.fill(ms.float32, (s, s), MASK_VALUE))
    return mask.reshape(1, 1, s, s)


# storage-order positions (context parallelism) -> the one mask the model's layers share
_STORAGE_MASKS = weakref.WeakValueDictionary()


def _storage_order_mask(positions) -> Tensor:
    key = tuple(int(p) for p in positions)
    mask = _STORAGE_MASKS.get(key)
    if mask is None:
        mask = _STORAGE_MASKS[key] = causal_mask(len(key), np.asarray(key))
    return mask


class AttentionMask(nn.Cell):
    """(position_ids (b, s) or None, segment_ids (b, s) or None) -> additive float32 mask (b, 1, s, s): 0
    where the key is in the query's segment and not after it (by position; None: 0..s-1), ``MASK_VALUE``
    elsewhere. One op for the sharding pass (``attention_mask``): the batch may be split, the sequence
    must be whole."""
    sharding_op = "attention_mask"
    sharding_params = ()

    def sharding_attrs(self) -> dict:
        return {}

    def shard(self, config):
        return None, None, None

    def construct(self, position_ids=None, segment_ids=None):
        if position_ids is None:
            b, s = segment_ids.shape
            pos = ops.broadcast_to(ops.expand_dims(ops.arange(s, dtype=ms.int32), 0), (b, s))
        else:
            pos = ops.cast(position_ids, ms.int32)
        allowed = ops.expand_dims(pos, 1) <= ops.expand_dims(pos, 2)          # (b, query, key)
        if segment_ids is not None:
            seg = ops.cast(segment_ids, ms.int32)
            allowed = ops.logical_and(allowed, ops.expand_dims(seg, 1) == ops.expand_dims(seg, 2))
        mask = ops.select(allowed, ops.zeros(allowed.shape, ms.float32),
                          ops.fill(ms.float32, allowed.shape, MASK_VALUE))
        return ops.expand_dims(mask, 1)


class DotProductAttention(nn.Cell):
    """softmax(q k^T / sqrt(d) + causal mask) v for q (b, n, s, d), k (b, g, s, d) and v
    (b, g, s, dv) with g key/value heads (each shared by n // g query heads); returns (b, s, n * dv).
    ``mask`` (b, 1, s, s), optional: an additive mask (``AttentionMask``) instead of the built-in
    causal one, which is built in the graph for q's length s (any s); with context parallelism
    (``context_parallel_size > 1``) it is the constant mask of the seq_length storage-order positions,
    one per model (``self.mask``; None otherwise).

    One op for the sharding pass (``scaled_dot_product_attention``): heads may be split (tensor
    parallel); a sequence split over ``cp`` runs the context-parallel kernel instead (ring,
    Ulysses or hybrid, from ``config.context_parallel_algo``)."""
    sharding_op = "scaled_dot_product_attention"
    sharding_params = ()

    def __init__(self, config: TransformerConfig, softmax_dim=None):
        super().__init__()
        self.repeat = config.num_attention_heads // config.query_groups
        self.scale = 1.0 / math.sqrt(config.head_dim if softmax_dim is None else softmax_dim)
        # context parallelism: the storage order's mask, shared by the layers; else built from q's length
        self.mask = _storage_order_mask(config.token_positions()) if config.context_parallel_size > 1 else None
        self.cp_attrs = {"causal": True, "seq_axis": "cp", "algorithm": config.context_parallel_algo,
                         "ulysses_degree": config.ulysses_degree_in_cp,
                         "load_balance": config.context_parallel_load_balance}
        self.compute_dtype = config.ms_compute_dtype
        self.low_precision = config.compute_dtype != "float32"   # softmax in float32 either way
        self.dropout_p = config.attention_dropout
        self.use_dropout = config.attention_dropout > 0

    def sharding_attrs(self) -> dict:
        return dict(self.cp_attrs)

    def shard(self, config: TransformerConfig):
        return None, None, None

    def construct(self, q, k, v, mask=None):
        if mask is None:
            mask = self.causal(q.shape[2])
        k, v = repeat_kv(k, v, self.repeat)
        probs = attention_probs(q, k, mask, self.scale, self.low_precision, self.compute_dtype)
        if self.use_dropout:
            probs = ops.dropout(probs, p=self.dropout_p, training=self.training)
        return attention_context(probs, v)


    def causal(self, s: int):
        """The built-in causal mask (1, 1, s, s) for s queries and keys."""
        if self.mask is None:
            return causal_mask_of_length(s)
        if s != self.mask.shape[-1]:
            raise ValueError(f"DotProductAttention: {s} tokens with context parallelism: the causal mask is the "
                             f"storage order of seq_length={self.mask.shape[-1]} tokens; give inputs of that length")
        return self.mask


# primitives with transpose flags, not ops.matmul: under jit on CPU the functional form's backward kept
# transposed copies (measured: docs/performance.md, 'Memory of a jit training step at real size')
_SCORES = ops.BatchMatMul(transpose_b=True)
_CONTEXT = ops.BatchMatMul()


def repeat_kv(k, v, repeat: int):
    """GQA: each of the g key/value heads repeated for its ``repeat`` query heads (b, g, L, d) -> (b, g*r, L, d)."""
    if repeat > 1:
        k = ops.repeat_interleave(k, repeat, 1)
        v = ops.repeat_interleave(v, repeat, 1)
    return k, v


def attention_probs(q, k, mask, scale: float, low_precision: bool, compute_dtype):
    """softmax(q k^T * scale + mask) over the keys, in float32 whatever the compute dtype (the one softmax
    core of ``DotProductAttention`` and the KV cache's attention, ``kv_cache.KVCache``)."""
    scores = _SCORES(q, k)
    if low_precision:
        scores = ops.cast(scores, ms.float32)
    probs = ops.softmax(scores * scale + mask, axis=-1)
    if low_precision:
        probs = ops.cast(probs, compute_dtype)
    return probs


def attention_context(probs, v):
    """probs (b, n, s, L) @ v (b, n, L, dv) -> (b, s, n * dv)."""
    b, s = probs.shape[0], probs.shape[2]
    ctx = _CONTEXT(probs, v)
    return ops.transpose(ctx, (0, 2, 1, 3)).reshape(b, s, -1)


class HeadNorm(RMSNorm):
    """Qwen3's q/k norm: RMSNorm over the last dim (head_dim) of (b, s, heads, head_dim), one weight
    shared by all heads. It runs inside the tensor-parallel region (heads may be split, the sequence is
    whole), so it declares no layout of its own, sequence parallel or not."""

    def shard(self, config: TransformerConfig):
        return None, None, None


class SelfAttention(nn.Cell):
    """(b, s, h) -> (b, s, h): q/k/v projections (column-parallel), rotary on q and k, core
    attention, output projection (row-parallel). The spec's ``q_norm`` / ``k_norm`` (Qwen3's
    ``HeadNorm``) normalize q and k per head before the rotary embedding; its ``core`` replaces
    :class:`DotProductAttention`."""

    def __init__(self, config: TransformerConfig, layer_number: int = 1, spec: AttentionSpec = None):
        super().__init__()
        spec = AttentionSpec() if spec is None else spec
        self.layer_number = layer_number
        self.head_dim = config.head_dim
        bias = config.add_bias_linear
        q_size = config.num_attention_heads * config.head_dim
        kv_size = config.query_groups * config.head_dim
        qkv_bias = bias or config.add_qkv_bias
        self.linear_q = ColumnParallelLinear(config.hidden_size, q_size, config, bias=qkv_bias)
        self.linear_k = ColumnParallelLinear(config.hidden_size, kv_size, config, bias=qkv_bias)
        self.linear_v = ColumnParallelLinear(config.hidden_size, kv_size, config, bias=qkv_bias)
        self.has_q_norm, self.has_k_norm = spec.q_norm is not None, spec.k_norm is not None
        if self.has_q_norm:
            self.q_layernorm = spec.q_norm(config.head_dim, config)
        if self.has_k_norm:
            self.k_layernorm = spec.k_norm(config.head_dim, config)
        self.rotary = RotaryEmbedding(config)
        self.rotary_by_position = PositionRotary(config)
        self.attention_mask = AttentionMask()
        self.core_attention = (spec.core or DotProductAttention)(config)
        self.linear_proj = RowParallelLinear(q_size, config.hidden_size, config, bias=bias)
        self.kv_cache = None    # a transformer.kv_cache.KVCache while generating (generation.cache)

    def construct(self, x, position_ids=None, segment_ids=None, cache_slots=None, kv_mask=None):
        b, s = x.shape[0], x.shape[1]
        q = self.linear_q(x).reshape(b, s, -1, self.head_dim)
        k = self.linear_k(x).reshape(b, s, -1, self.head_dim)
        v = self.linear_v(x).reshape(b, s, -1, self.head_dim)
        if self.has_q_norm:
            q = self.q_layernorm(q)
        if self.has_k_norm:
            k = self.k_layernorm(k)
        if cache_slots is not None:
            return self.cached(q, k, v, position_ids, cache_slots, kv_mask)
        q = ops.transpose(self.rotate(q, position_ids), (0, 2, 1, 3))
        k = ops.transpose(self.rotate(k, position_ids), (0, 2, 1, 3))
        v = ops.transpose(v, (0, 2, 1, 3))
        if position_ids is None and segment_ids is None:
            ctx = self.core_attention(q, k, v)
        else:
            ctx = self.core_attention(q, k, v, self.attention_mask(position_ids, segment_ids))
        return self.linear_proj(ctx)

    def cached(self, q, k, v, position_ids, cache_slots, kv_mask):
        """Generation against ``self.kv_cache`` (``kv_cache.KVCache``): ``cache_slots`` is the step's
        ``(scatter, written)`` and ``kv_mask`` its ``(mask, cos, sin)``, computed once per step for every layer
        (``kv_cache.CacheStep``); q and k are rotated, k and v written into the cache, q attends to the whole
        cache. ``position_ids`` is not read (the step's rotary rows carry the positions); the cache's attention
        is ``DotProductAttention``'s math (a ``spec.core`` replacement is not used here)."""
        scatter, written = cache_slots
        mask, cos, sin = kv_mask
        q, k, v = (ops.transpose(t, (0, 2, 1, 3)) for t in (q, k, v))
        return self.linear_proj(self.kv_cache(q, k, v, mask, scatter, written, cos, sin))

    def rotate(self, x, position_ids):
        """Rotary on (b, s, heads, d): the constant tables, or the angles of ``position_ids``."""
        if position_ids is None:
            return self.rotary(x)
        return self.rotary_by_position(x, position_ids)
