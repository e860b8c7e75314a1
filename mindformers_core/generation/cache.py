"""Attach / detach the static KV caches (``transformer.kv_cache.KVCache``) on a model's attention layers."""
from __future__ import annotations

from typing import List

from ..transformer.attention import SelfAttention
from ..transformer.kv_cache import KVCache, LatentKVCache
from ..transformer.mla import MultiLatentAttention


def attention_layers(model) -> List[SelfAttention]:
    found = [cell for _, cell in model.cells_and_names() if isinstance(cell, (SelfAttention, MultiLatentAttention))]
    if not found:
        raise ValueError(f"{type(model).__name__}: no SelfAttention layer to hold a KV cache (generation needs a "
                         "GPTModel-family model)")
    return found


def attach_kv_cache(model, batch_size: int, max_length: int) -> List[KVCache]:
    """One cache of ``max_length`` slots for ``batch_size`` rows per attention layer (multi-latent attention:
    its compressed ``LatentKVCache``); the cache Parameters are named after the layer that holds them (unique
    names for graphs and plans)."""
    config = model.config
    caches = []
    for att in attention_layers(model):
        if isinstance(att, MultiLatentAttention):       # the compressed cache: latents and the shared rotary key
            att.kv_cache = LatentKVCache(config, batch_size, max_length)
        else:
            att.kv_cache = KVCache(config, batch_size, max_length, value_dim=config.head_dim)
        caches.append(att.kv_cache)
    set_cache_names(model)
    return caches


def set_cache_names(model) -> None:
    for name, param in model.parameters_and_names():
        if ".kv_cache." in name or name.startswith("kv_cache."):
            param.name = name


def reattach(model, caches) -> None:
    for att, cache in zip(attention_layers(model), caches):
        att.kv_cache = cache
    set_cache_names(model)      # setting the attribute again gave the Parameters their bare names back


def detach_kv_cache(model) -> None:
    """The model as it was: no cache Parameters among its parameters (checkpoints, optimizers)."""
    for att in attention_layers(model):
        att.kv_cache = None
