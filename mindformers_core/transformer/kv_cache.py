"""A static key/value cache for generation: one ``KVCache`` Cell per attention layer.

The cache holds keys (b, g, L, d) and values (b, g, L, dv) of ``L = max_length`` slots as non-trainable
Parameters, allocated once for a generation (batch size and length fixed), so a prefill step over the
prompt and a decode step per token each have one static shape: ``jit`` compiles each once. Which slots a
step writes are inputs (``cache_slots`` (s,) int32: the same slots for every row, which left padding
makes possible), not Python numbers, so no step recompiles for the next position.

What depends on the step only -- the additive mask (b, 1, s, L), the write's one-hot scatter (L, s) and its
written slots, the rotary rows of the step's positions (b, 1, s, d) -- is computed once per step by
``CacheStep`` (one op for the sharding pass, ``kv_cache_step``; it holds the rotary tables for the ``L``
positions the generation reaches: the model's own are built for its training ``seq_length``) and handed to
every layer, instead of once per layer.

Writing is a one-hot matmul (exact in float32: one term of 1 * x and zeros) and a select, then
``ops.assign`` into the Parameters, so the graph and PyNative both update the same storage.

``KVCache`` is one op for the sharding pass (``kv_cache_attention``: rotate q and k, write the cache, then
attend to it): with tensor parallelism the heads are split and each rank holds the cache slice of its
key/value heads (``sharding/rules/kv_cache.py``).
"""
from __future__ import annotations

import math

import mindspore as ms
from mindspore import Parameter, nn, ops

from .attention import attention_context, attention_probs, repeat_kv
from .config import TransformerConfig
from .rotary import _Rotary, rotate, shared_rotary_tables

MASK_VALUE = -1.0e9


class KVCache(nn.Cell):
    """``(q (b, n, s, d), k (b, g, s, d), v (b, g, s, dv), step) -> (b, s, n * dv)`` with ``step`` =
    ``CacheStep``'s ``(mask (b, 1, s, L), scatter (L, s), written (1, 1, L, 1), cos, sin (b, 1, s, d))``: q and k
    rotated, k and v written into the cache at the step's slots (and stored), then softmax(q K^T / sqrt(d) +
    mask) V over the whole cache (``DotProductAttention``'s softmax core, keys L instead of s)."""
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
        rotation = _Rotary(config)
        self.half, self.rotary_dim, self.partial = rotation.half, rotation.rotary_dim, rotation.partial
        self.rotate_low, self.interleaved = rotation.low_precision, rotation.interleaved
        dtype = config.ms_compute_dtype
        self.key_cache = Parameter(ops.zeros((batch_size, g, self.max_length, d), dtype),
                                   name=f"{name}.key_cache", requires_grad=False)
        self.value_cache = Parameter(ops.zeros((batch_size, g, self.max_length, dv), dtype),
                                     name=f"{name}.value_cache", requires_grad=False)

    def sharding_attrs(self) -> dict:
        return {}

    def shard(self, config):
        return None, None, None

    def construct(self, q, k, v, mask, scatter, written, cos, sin):
        q = rotate(q, cos, sin, self.half, self.rotary_dim, self.partial, self.rotate_low, self.interleaved)
        k = rotate(k, cos, sin, self.half, self.rotary_dim, self.partial, self.rotate_low, self.interleaved)
        keys, values = repeat_kv(*self.write(k, v, scatter, written), self.repeat)
        probs = attention_probs(q, keys, mask, self.scale, self.low_precision, self.compute_dtype)
        return attention_context(probs, values)

    def write(self, k, v, scatter, written):
        """The cache with k, v (b, g, s, d) written where ``scatter`` (L, s) puts them (slots ``written``);
        stored and returned."""
        return write_slots(self.key_cache, k, scatter, written), write_slots(self.value_cache, v, scatter, written)


def write_slots(cache, x, scatter, written):
    """``cache`` (b, g, L, d) with x (b, g, s, d) written where ``scatter`` (L, s) puts its columns (slots
    ``written`` (1, 1, L, 1)): assigned to the cache Parameter, then the Parameter read again and returned.

    Why read it again rather than return the assigned value (``ops.depend(full, ops.assign(cache, full))``): with
    the written value flowing on into the next layers, MindSpore 2.10's backend linked the graph's side effects
    in a time exponential in the number of layers (``GraphScheduler::LinkControlArrowByAutoMonad``; hidden 256:
    0.9 s at 8 layers, 13-15 s at 10, Qwen3-0.6B's 28-layer prefill never finished). Reading the Parameter after
    its assign (ordered by the assign's monad) links in 0.06 s at 10 layers and 0.17-0.26 s at 28."""
    full = ops.select(ops.broadcast_to(written, cache.shape), ops.matmul(scatter, x), cache)
    ops.assign(cache, full)
    return cache + 0


class LatentKVCache(nn.Cell):
    """Multi-latent attention's compressed cache (``transformer/mla.py``): per token the normed kv latent
    (kv_lora_rank numbers) and the one rotated rotary key shared by every head (qk_rope_head_dim), instead of
    every head's key and value -- what makes MLA's cache small. Each step the keys and values of all ``L``
    slots are up-projected again from the cached latents (by the layer's own ``linear_kv_up_proj``, outside
    this Cell, so tensor parallelism splits that projection's heads as in training).

    ``(q_rot (b, n, s, dr), latent (b, 1, s, r), k_rot (b, 1, s, dr), scatter (L, s), written (1, 1, L, 1),
    cos, sin (b, 1, s, dr)) -> (q_rot rotated, latents (b, 1, L, r), rotated keys (b, 1, L, dr))``: q's and k's
    rotary parts rotated at the step's positions, the latent and the rotated key written at the step's slots.
    One op for the sharding pass (``latent_kv_cache``): q's heads may be split; the latents are whole on
    every rank (the batch may be split)."""
    sharding_op = "latent_kv_cache"
    sharding_params = ("latent_cache", "rope_cache")

    def __init__(self, config: TransformerConfig, batch_size: int, max_length: int, name: str = "kv_cache"):
        super().__init__()
        self.max_length = int(max_length)
        rotation = _Rotary(config, config.qk_pos_emb_head_dim)
        self.half, self.rotary_dim, self.partial = rotation.half, rotation.rotary_dim, rotation.partial
        self.rotate_low, self.interleaved = rotation.low_precision, rotation.interleaved
        dtype = config.ms_compute_dtype
        self.latent_cache = Parameter(ops.zeros((batch_size, 1, self.max_length, config.kv_lora_rank), dtype),
                                      name=f"{name}.latent_cache", requires_grad=False)
        self.rope_cache = Parameter(ops.zeros((batch_size, 1, self.max_length, config.qk_pos_emb_head_dim), dtype),
                                    name=f"{name}.rope_cache", requires_grad=False)

    def sharding_attrs(self) -> dict:
        return {}

    def shard(self, config):
        return None, None, None

    def construct(self, q_rot, latent, k_rot, scatter, written, cos, sin):
        q_rot = rotate(q_rot, cos, sin, self.half, self.rotary_dim, self.partial, self.rotate_low, self.interleaved)
        k_rot = rotate(k_rot, cos, sin, self.half, self.rotary_dim, self.partial, self.rotate_low, self.interleaved)
        return (q_rot, write_slots(self.latent_cache, latent, scatter, written),
                write_slots(self.rope_cache, k_rot, scatter, written))


class CacheStep(nn.Cell):
    """``(position_ids (b, s), cache_slots (s,), kv_valid (b, L)) -> (mask (b, 1, s, L), scatter (L, s),
    written (1, 1, L, 1), cos (b, 1, s, d), sin (b, 1, s, d))``: what every layer's ``KVCache`` needs of the
    step, once per step. ``mask``: 0 where the key slot holds a real token (``kv_valid`` = 1) not after the
    query's slot, ``MASK_VALUE`` elsewhere; ``scatter``: the one-hot matrix that puts the step's s columns at
    their slots; ``cos``/``sin``: the rotary rows of each token's position. One op for the sharding pass
    (``kv_cache_step``): the batch may be split."""
    sharding_op = "kv_cache_step"
    sharding_params = ("cos", "sin")

    def __init__(self, config: TransformerConfig, max_length: int):
        super().__init__()
        positions = max(int(max_length), config.max_positions)
        rotation = _Rotary(config)
        # the model's own max_positions tables when the generation stays within them (one copy: rotary.py)
        cos, sin = shared_rotary_tables(positions, rotation.head_dim, rotation.rotary_dim, config.rotary_base,
                                        rotation.scaling)
        self.cos, self.sin = cos, sin
        self.dtype = config.ms_compute_dtype

    def sharding_attrs(self) -> dict:
        return {}

    def shard(self, config):
        return None, None, None

    def construct(self, position_ids, cache_slots, kv_valid):
        length = kv_valid.shape[-1]
        mask = cache_mask(cache_slots, kv_valid)
        slots = ops.cast(cache_slots, ms.int32)
        onehot = ops.cast(ops.expand_dims(slots, 1) == ops.expand_dims(ops.arange(length, dtype=ms.int32), 0),
                          self.dtype)                                          # (s, L)
        written = ops.reshape(ops.reduce_sum(onehot, 0) > 0.5, (1, 1, length, 1))
        ids = ops.cast(position_ids, ms.int32)
        # rows gathered from the (P, 1, d) tables as they are: slicing a table to (P, d) first copied the
        # whole table at every step (two StridedSlice kernels, ~0.28 ms each, the step's largest after the head)
        cos = ops.transpose(ops.gather(self.cos, ids, 0), (0, 2, 1, 3))            # (b, s, 1, d) -> (b, 1, s, d)
        sin = ops.transpose(ops.gather(self.sin, ids, 0), (0, 2, 1, 3))
        return mask, ops.transpose(onehot, (1, 0)), written, cos, sin


def cache_mask(cache_slots, kv_valid):
    """``(cache_slots (s,), kv_valid (b, L)) -> (b, 1, s, L)``: the step's additive float32 mask."""
    length = kv_valid.shape[-1]
    slots = ops.cast(cache_slots, ms.int32)
    causal = ops.expand_dims(ops.arange(length, dtype=ms.int32), 0) <= ops.expand_dims(slots, 1)     # (s, L)
    valid = ops.expand_dims(ops.cast(kv_valid, ms.int32) > 0, 1)                                    # (b, 1, L)
    allowed = ops.logical_and(ops.expand_dims(causal, 0), valid)                                    # (b, s, L)
    mask = ops.select(allowed, ops.zeros(allowed.shape, ms.float32), ops.fill(ms.float32, allowed.shape, MASK_VALUE))
    return ops.expand_dims(mask, 1)
