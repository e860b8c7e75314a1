"""Multi-latent attention (MLA, DeepSeek-V2/V3): attention whose keys and values come from one small latent.

Per token, the hidden state is projected down to a latent ``c_kv`` of ``kv_lora_rank`` (normed) and to one
rotary key part ``k_rot`` of ``qk_pos_emb_head_dim`` shared by all heads; ``c_kv`` is projected up to every
head's non-rotary key part (``qk_head_dim``) and value (``v_head_dim``). Queries go through their own
low-rank pair (``q_lora_rank``: down, norm, up; None or 0: one plain projection, DeepSeek-V2-Lite) and are
split into a non-rotary and a rotary part. The softmax scale is 1/sqrt(qk_head_dim + qk_pos_emb_head_dim),
times YaRN's m(mscale_all_dim)^2 when ``rotary_scaling`` is set. What a cache would hold per token is
``kv_lora_rank + qk_pos_emb_head_dim`` numbers instead of 2 x heads x head_dim -- the reason MLA exists.

Layouts (declared, no communication here): the up-projections are column-parallel (heads split over
tp), the output projection row-parallel, as in :class:`SelfAttention`. The down-projections and their
norms are replicated (:class:`LatentLinear`, :class:`LatentNorm`): their outputs are the latents every
head needs, and they are small (hidden x rank), so splitting them would only add a gather of the latent
before each up-projection; their activations are left to propagation. Sequence parallelism is refused
for now (``mla_problems``). The shared rotary key is expanded to the rank's heads
by :class:`SharedRotaryKey` (one op: its rule keeps the heads' split, so k_rot's gradient is summed over
tp by the pass).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

from mindspore import nn, ops

from .attention import AttentionMask, DotProductAttention
from .config import TransformerConfig
from .linear import ColumnParallelLinear, RowParallelLinear, _Linear
from .norm import RMSNorm
from .rotary import PositionRotary, RotaryEmbedding
from .spec import AttentionSpec
from .yarn import yarn_softmax_mscale


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


@dataclass
class MLATransformerConfig(TransformerConfig):
    """TransformerConfig with multi-latent attention's sizes (Megatron-core's names; Hugging Face's in
    brackets): ``q_lora_rank`` (None/0: a plain q projection), ``kv_lora_rank`` (required),
    ``qk_head_dim`` (qk_nope_head_dim), ``qk_pos_emb_head_dim`` (qk_rope_head_dim, even: the rotary
    part), ``v_head_dim``. ``kv_channels`` is the rotary part's size (what the rotary tables cover);
    every head has its own key/value (``num_query_groups`` = heads)."""
    multi_latent_attention: bool = True
    q_lora_rank: Optional[int] = None
    kv_lora_rank: Optional[int] = None
    qk_head_dim: int = 128
    qk_pos_emb_head_dim: int = 64
    v_head_dim: int = 128

    def __post_init__(self):
        if self.multi_latent_attention:
            for field, value, rule in mla_problems(self):
                raise ValueError(f"TransformerConfig: {field}={value!r}: {rule}")
            if self.kv_channels is None:
                self.kv_channels = self.qk_pos_emb_head_dim
        super().__post_init__()

    @property
    def softmax_scale(self) -> float:
        """1/sqrt(qk_head_dim + qk_pos_emb_head_dim) x YaRN's m(mscale_all_dim)^2 (DeepSeek's)."""
        return yarn_softmax_mscale(self.rotary_scaling) / math.sqrt(self.qk_head_dim + self.qk_pos_emb_head_dim)


def mla_problems(c) -> list:
    """``(field, value, rule)`` for every inconsistent multi-latent attention setting of ``c``."""
    out = []
    if not _is_int(c.kv_lora_rank) or c.kv_lora_rank < 1:
        out.append(("kv_lora_rank", c.kv_lora_rank, "multi-latent attention needs the key/value latent's size: "
                    "an integer >= 1 (DeepSeek-V3: 512)"))
    if c.q_lora_rank is not None and (not _is_int(c.q_lora_rank) or c.q_lora_rank < 0):
        out.append(("q_lora_rank", c.q_lora_rank, "must be null/0 (a plain q projection) or an integer >= 1"))
    for name, hf in (("qk_head_dim", "qk_nope_head_dim"), ("qk_pos_emb_head_dim", "qk_rope_head_dim"),
                     ("v_head_dim", "v_head_dim")):
        v = getattr(c, name)
        if not _is_int(v) or v < 1:
            out.append((f"{name} ({hf})", v, "must be an integer >= 1"))
    rot = c.qk_pos_emb_head_dim
    if _is_int(rot) and rot % 2:
        out.append(("qk_pos_emb_head_dim (qk_rope_head_dim)", rot, "must be even (the rotary embedding turns "
                    "channel pairs)"))
    if c.kv_channels is not None and _is_int(rot) and c.kv_channels != rot:
        out.append(("kv_channels (head_dim)", c.kv_channels, f"with multi-latent attention is the rotary part's "
                    f"size, qk_pos_emb_head_dim={rot}; leave it unset"))
    if c.num_query_groups not in (None, c.num_attention_heads):
        out.append(("num_query_groups (n_kv_heads)", c.num_query_groups, "multi-latent attention gives every head "
                    f"its own key and value: leave it unset or = num_attention_heads={c.num_attention_heads}"))
    tp = c.tensor_model_parallel_size
    if _is_int(tp) and tp >= 1 and c.num_attention_heads % tp:
        out.append(("num_attention_heads", c.num_attention_heads, f"must be divisible by "
                    f"tensor_model_parallel_size={tp} (multi-latent attention splits the heads over tp)"))
    return out


class LatentLinear(_Linear):
    """A down-projection to a latent: weight replicated (every tensor-parallel rank needs the whole latent);
    activations follow propagation (sequence-split under sequence parallel)."""

    def shard(self, config: TransformerConfig):
        return None, None, {"weight": config.layout("None", "None")}


class LatentNorm(RMSNorm):
    """RMSNorm of a latent: replicated weight, no activation layout of its own (it follows its projection)."""

    def shard(self, config: TransformerConfig):
        return None, None, None


class SharedRotaryKey(nn.Cell):
    """``(k_nope (b, s, n, dn), k_rot (b, s, 1, dr)) -> (b, s, n, dn + dr)``: the one rotary key part
    appended to every head's key. One op for the sharding pass (``shared_rotary_key``): the heads of
    k_nope may be split, k_rot is whole over them; each rank expands it to the heads it holds."""
    sharding_op = "shared_rotary_key"
    sharding_params = ()

    def sharding_attrs(self) -> dict:
        return {}

    def shard(self, config):
        return None, None, None

    def construct(self, k_nope, k_rot):
        shape = k_nope.shape[:3] + (k_rot.shape[3],)
        return ops.cat((k_nope, ops.broadcast_to(k_rot, shape)), -1)


class LatentAttentionCore(DotProductAttention):
    """:class:`DotProductAttention` with the softmax scale multi-latent attention defines (the context-parallel
    kernels read ``scale`` too)."""

    def __init__(self, config: MLATransformerConfig):
        super().__init__(config)
        self.scale = float(config.softmax_scale)


class MultiLatentAttention(nn.Cell):
    """(b, s, h) -> (b, s, h). Built from an :class:`MLATransformerConfig` (``AttentionSpec(module=
    MultiLatentAttention)``); the spec's ``core`` replaces :class:`LatentAttentionCore` (its ``q_norm`` /
    ``k_norm`` do not apply: the latents have their own norms). ``position_ids`` / ``segment_ids`` as in
    ``SelfAttention``; generation against the compressed cache ``kv_cache.LatentKVCache`` (``cached``)."""

    def __init__(self, config: MLATransformerConfig, layer_number: int = 1, spec: AttentionSpec = None):
        super().__init__()
        if not getattr(config, "multi_latent_attention", False):
            raise ValueError(f"MultiLatentAttention: needs a config with multi_latent_attention=True "
                             f"(MLATransformerConfig), got {type(config).__name__}")
        spec = AttentionSpec() if spec is None else spec
        if spec.q_norm is not None or spec.k_norm is not None:
            raise ValueError("MultiLatentAttention: AttentionSpec q_norm/k_norm do not apply (the latents are "
                             "normed by q_layernorm / kv_layernorm); leave them None")
        h, n = config.hidden_size, config.num_attention_heads
        self.layer_number = layer_number
        self.nope, self.rope, self.vdim = config.qk_head_dim, config.qk_pos_emb_head_dim, config.v_head_dim
        self.kv_rank = config.kv_lora_rank
        qk = self.nope + self.rope
        self.q_low_rank = bool(config.q_lora_rank)
        if self.q_low_rank:
            self.linear_q_down_proj = LatentLinear(h, config.q_lora_rank, config)
            self.q_layernorm = LatentNorm(config.q_lora_rank, config, eps=1e-6)
            self.linear_q_up_proj = ColumnParallelLinear(config.q_lora_rank, n * qk, config)
        else:
            self.linear_q_proj = ColumnParallelLinear(h, n * qk, config)
        self.linear_kv_down_proj = LatentLinear(h, self.kv_rank + self.rope, config)
        self.kv_layernorm = LatentNorm(self.kv_rank, config, eps=1e-6)
        self.linear_kv_up_proj = ColumnParallelLinear(self.kv_rank, n * (self.nope + self.vdim), config)
        # q's and k's rotary Cells apart: the sharding pass gives each Cell object one set of boundary layouts
        # (q's heads split over tp, k's single shared head whole)
        self.rotary_q, self.rotary_k = RotaryEmbedding(config, self.rope), RotaryEmbedding(config, self.rope)
        self.rotary_by_position_q = PositionRotary(config, self.rope)
        self.rotary_by_position_k = PositionRotary(config, self.rope)
        self.shared_key = SharedRotaryKey()
        self.attention_mask = AttentionMask()
        self.core_attention = (spec.core or LatentAttentionCore)(config)
        self.linear_proj = RowParallelLinear(n * self.vdim, h, config)
        self.kv_cache = None    # a transformer.kv_cache.LatentKVCache while generating (generation.cache)

    def construct(self, x, position_ids=None, segment_ids=None, cache_slots=None, kv_mask=None):
        # Every reshape takes its batch and sequence sizes from the tensor it reshapes, never from x: under
        # sequence parallelism x and the down-projections hold this rank's slice of the sequence while the
        # up-projections' outputs hold all of it (the pass gathers the latent at their input).
        if self.q_low_rank:
            q = self.linear_q_up_proj(self.q_layernorm(self.linear_q_down_proj(x)))
        else:
            q = self.linear_q_proj(x)
        q = q.reshape(q.shape[0], q.shape[1], -1, self.nope + self.rope)
        q_nope, q_rot = ops.split(q, [self.nope, self.rope], -1)
        latent, k_rot = ops.split(self.linear_kv_down_proj(x), [self.kv_rank, self.rope], -1)
        latent = self.kv_layernorm(latent)
        k_rot = k_rot.reshape(k_rot.shape[0], k_rot.shape[1], 1, self.rope)
        if cache_slots is not None:
            return self.cached(q_nope, q_rot, latent, k_rot, cache_slots, kv_mask)
        kv = self.linear_kv_up_proj(latent)
        kv = kv.reshape(kv.shape[0], kv.shape[1], -1, self.nope + self.vdim)
        k_nope, v = ops.split(kv, [self.nope, self.vdim], -1)
        if position_ids is None:
            q_rot, k_rot = self.rotary_q(q_rot), self.rotary_k(k_rot)
        else:
            q_rot, k_rot = self.rotary_by_position_q(q_rot, position_ids), self.rotary_by_position_k(k_rot, position_ids)
        q = ops.cat((q_nope, q_rot), -1)
        k = self.shared_key(k_nope, k_rot)
        q = ops.transpose(q, (0, 2, 1, 3))
        k = ops.transpose(k, (0, 2, 1, 3))
        v = ops.transpose(v, (0, 2, 1, 3))
        if position_ids is None and segment_ids is None:
            ctx = self.core_attention(q, k, v)
        else:
            ctx = self.core_attention(q, k, v, self.attention_mask(position_ids, segment_ids))
        return self.linear_proj(ctx)

    def cached(self, q_nope, q_rot, latent, k_rot, cache_slots, kv_mask):
        """Generation against ``self.kv_cache`` (``kv_cache.LatentKVCache``, the compressed cache): the step's
        latent and rotated shared key written at its slots, every slot's keys and values up-projected from
        the cached latents, q attending to them under the step's mask (``kv_cache.CacheStep``)."""
        scatter, written = cache_slots
        mask, cos, sin = kv_mask
        b, s = latent.shape[0], latent.shape[1]
        q_rot, latents, rotated = self.kv_cache(ops.transpose(q_rot, (0, 2, 1, 3)), latent.reshape(b, 1, s, -1),
                                                ops.transpose(k_rot, (0, 2, 1, 3)), scatter, written, cos, sin)
        length = latents.shape[2]
        kv = self.linear_kv_up_proj(latents.reshape(b, length, -1)).reshape(b, length, -1, self.nope + self.vdim)
        k_nope, v = ops.split(kv, [self.nope, self.vdim], -1)
        k = self.shared_key(k_nope, ops.transpose(rotated, (0, 2, 1, 3)))
        q = ops.cat((ops.transpose(q_nope, (0, 2, 1, 3)), q_rot), -1)
        ctx = self.core_attention(q, ops.transpose(k, (0, 2, 1, 3)), ops.transpose(v, (0, 2, 1, 3)), mask)
        return self.linear_proj(ctx)


__all__ = ["MLATransformerConfig", "MultiLatentAttention", "LatentLinear", "LatentNorm", "SharedRotaryKey",
           "LatentAttentionCore", "mla_problems"]
