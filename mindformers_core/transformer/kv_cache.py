"""A static key/value cache for generation: one ``KVCache`` Cell per attention layer.

The cache holds keys (b, g, L, d) and values (b, g, L, dv) of ``L = max_length`` slots as non-trainable
Parameters, allocated once for a generation (batch size and length fixed), so a prefill step over the
prompt and a decode step per token each have one static shape: ``jit`` compiles each once. Which slots a
step writes are inputs (``cache_slots`` (s,) int32: the same slots for every row, which left padding
makes possible), not Python numbers, so no step recompiles for the next position.

Writing is a one-hot matmul (exact in float32: one term of 1 * x and zeros) and a select, then
``ops.assign`` into the Parameters, so the graph and PyNative both update the same storage. The Cell also
holds the by-position rotary tables for the ``L`` positions the generation reaches (the model's own
tables are built for its training ``seq_length``).

``KVCache`` is one op for the sharding pass (``kv_cache_attention``: write the cache, then attend to it):
with tensor parallelism the heads are split and each rank holds the cache slice of its key/value heads
(``sharding/rules/kv_cache.py``). ``CacheMask`` (``kv_cache_mask``) builds the additive mask (b, 1, s, L)
from the slots and the valid key slots, once per step.
"""
from __future__ import annotations

import dataclasses
import math

import mindspore as ms
from mindspore import Parameter, nn, ops

from .attention import attention_context, attention_probs, repeat_kv
from .config import TransformerConfig
from .rotary import PositionRotary

MASK_VALUE = -1.0e9


class KVCache(nn.Cell):
    """``(q (b, n, s, d), k (b, g, s, d), v (b, g, s, dv), cache_slots (s,), mask (b, 1, s, L)) -> (b, s, n * dv)``:
    k and v written into the cache at ``cache_slots`` (and stored), then softmax(q K^T / sqrt(d) + mask) V
    over the whole cache (the math of ``DotProductAttention``, keys L instead of s)."""
    sharding_op = "kv_cache_attention"
    sharding_params = ("key_cache", "value_cache")

    def __init__(self, config: TransformerConfig, batch_size: int, max_length: int, name: str = "kv_cache",
                 value_dim: int = None, softmax_dim: int = None):
        super().__init__()
        g, d = config.query_groups, config.head_dim
        dv = d if value_dim is None else value_dim
        self.max_length = int(max_length)
        self.repeat = config.num_attention_heads // config.query_groups
        self.scale = 1.0 / math.sqrt(d if softmax_dim is None else softmax_dim)
        self.compute_dtype = config.ms_compute_dtype
        self.low_precision = config.compute_dtype != "float32"   # softmax in float32 either way
        dtype = config.ms_compute_dtype
        self.key_cache = Parameter(ops.zeros((batch_size, g, self.max_length, d), dtype),
                                   name=f"{name}.key_cache", requires_grad=False)
        self.value_cache = Parameter(ops.zeros((batch_size, g, self.max_length, dv), dtype),
                                     name=f"{name}.value_cache", requires_grad=False)
        positions = max(self.max_length, config.max_positions)
        self.rotary = PositionRotary(dataclasses.replace(config, max_position_embeddings=positions))

    def sharding_attrs(self) -> dict:
        return {}

    def shard(self, config):
        return None, None, None

    def construct(self, q, k, v, cache_slots, mask):
        keys, values = repeat_kv(*self.write(k, v, cache_slots), self.repeat)
        probs = attention_probs(q, keys, mask, self.scale, self.low_precision, self.compute_dtype)
        return attention_context(probs, values)

    def write(self, k, v, cache_slots):
        """The cache with k, v (b, g, s, d) written at slots ``cache_slots`` (s,); stored and returned."""
        slots = ops.cast(cache_slots, ms.int32)
        onehot = ops.cast(ops.expand_dims(slots, 1) == ops.expand_dims(ops.arange(self.max_length, dtype=ms.int32), 0),
                          k.dtype)                                            # (s, L)
        scatter = ops.transpose(onehot, (1, 0))                               # (L, s)
        written = ops.reduce_sum(onehot, 0) > 0.5                             # (L,)
        where = ops.reshape(written, (1, 1, self.max_length, 1))
        keys = ops.select(ops.broadcast_to(where, self.key_cache.shape), ops.matmul(scatter, k), self.key_cache)
        values = ops.select(ops.broadcast_to(where, self.value_cache.shape), ops.matmul(scatter, v),
                            self.value_cache)
        keys = ops.depend(keys, ops.assign(self.key_cache, keys))
        values = ops.depend(values, ops.assign(self.value_cache, values))
        return keys, values


class CacheMask(nn.Cell):
    """``(cache_slots (s,), kv_valid (b, L)) -> (b, 1, s, L)`` additive float32 mask: 0 where the key slot
    holds a real token (``kv_valid`` = 1) and is not after the query's slot, ``MASK_VALUE`` elsewhere. One op
    for the sharding pass (``kv_cache_mask``): the batch may be split."""
    sharding_op = "kv_cache_mask"
    sharding_params = ()

    def sharding_attrs(self) -> dict:
        return {}

    def shard(self, config):
        return None, None, None

    def construct(self, cache_slots, kv_valid):
        return cache_mask(cache_slots, kv_valid)


def cache_mask(cache_slots, kv_valid):
    """The ``CacheMask`` computation (a plain function)."""
    length = kv_valid.shape[-1]
    slots = ops.cast(cache_slots, ms.int32)
    causal = ops.expand_dims(ops.arange(length, dtype=ms.int32), 0) <= ops.expand_dims(slots, 1)     # (s, L)
    valid = ops.expand_dims(ops.cast(kv_valid, ms.int32) > 0, 1)                                    # (b, 1, L)
    allowed = ops.logical_and(ops.expand_dims(causal, 0), valid)                                    # (b, s, L)
    mask = ops.select(allowed, ops.zeros(allowed.shape, ms.float32), ops.fill(ms.float32, allowed.shape, MASK_VALUE))
    return ops.expand_dims(mask, 1)
