"""YaRN rotary scaling (Peng et al. 2023, as DeepSeek-V2/V3 and Hugging Face's ``rope_type: yarn`` define it),
pure NumPy: the blended inverse frequencies, the cos/sin attention factor and DeepSeek's softmax mscale.

A YaRN setting is a mapping with ``factor`` (context extension ratio, > 1 to have an effect),
``original_max_position_embeddings`` (the pre-training context), ``beta_fast`` / ``beta_slow`` (rotations
that bound the blend: dims turning more than ``beta_fast`` times over the original context keep their
frequency, those turning fewer than ``beta_slow`` times are divided by ``factor``, a linear ramp between),
and ``mscale`` / ``mscale_all_dim`` (the cos/sin tables are scaled by m(mscale) / m(mscale_all_dim), and
DeepSeek's softmax scale by m(mscale_all_dim)^2, with m(x) = 0.1 x ln(factor) + 1).
"""
from __future__ import annotations

import math
from typing import Any, List, Mapping, Optional, Tuple

import numpy as np

__all__ = ["YARN_KEYS", "yarn_problems", "yarn_inv_freq", "yarn_attention_factor", "yarn_softmax_mscale",
           "yarn_mscale"]

YARN_KEYS = ("type", "rope_type", "factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "mscale",
             "mscale_all_dim", "rope_theta", "truncate")
DEFAULTS = {"beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 0.0, "truncate": True}


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def yarn_problems(scaling: Optional[Mapping[str, Any]]) -> List[Tuple[str, Any, str]]:
    """``(key, value, rule)`` for every bad entry of a YaRN setting (None: no scaling, no problem)."""
    if scaling is None:
        return []
    if not isinstance(scaling, Mapping):
        return [("rotary_scaling", scaling, "must be null or a mapping of YaRN keys (type: yarn, factor, ...)")]
    out = []
    kind = scaling.get("type", scaling.get("rope_type", "yarn"))
    if kind != "yarn":
        out.append(("rotary_scaling.type", kind, "only yarn is implemented (or no scaling: null / default)"))
    for key in scaling:
        if key not in YARN_KEYS:
            out.append((f"rotary_scaling.{key}", scaling[key], f"not a YaRN key; known: {list(YARN_KEYS)}"))
    for key in ("factor", "original_max_position_embeddings"):
        if not _number(scaling.get(key)) or scaling.get(key) <= 0:
            out.append((f"rotary_scaling.{key}", scaling.get(key), "is required and must be a number > 0"))
    for key in ("beta_fast", "beta_slow"):
        v = scaling.get(key)
        if v is not None and (not _number(v) or v <= 0):
            out.append((f"rotary_scaling.{key}", v, "must be a number > 0"))
    for key in ("mscale", "mscale_all_dim"):
        v = scaling.get(key)
        if v is not None and not _number(v):
            out.append((f"rotary_scaling.{key}", v, "must be a number"))
    return out


def _get(scaling: Mapping[str, Any], key: str):
    v = scaling.get(key)
    return DEFAULTS[key] if v is None else v


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """m = 0.1 x mscale x ln(factor) + 1 (1 when factor <= 1)."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def yarn_inv_freq(rotary_dim: int, base: float, scaling: Mapping[str, Any]) -> np.ndarray:
    """(rotary_dim / 2,) float64: each pair's frequency, blended between the original (extrapolation) and the
    original / factor (interpolation) by a linear ramp over the pairs between the beta_fast and beta_slow
    correction dims (rounded outwards unless ``truncate`` is false)."""
    factor = float(scaling["factor"])
    original = float(scaling["original_max_position_embeddings"])

    def correction_dim(rotations):
        return rotary_dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = correction_dim(_get(scaling, "beta_fast")), correction_dim(_get(scaling, "beta_slow"))
    if _get(scaling, "truncate"):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, rotary_dim - 1)
    if low == high:
        high += 0.001                      # a one-point ramp
    ramp = np.clip((np.arange(rotary_dim // 2, dtype=np.float64) - low) / (high - low), 0.0, 1.0)
    keep = 1.0 - ramp                      # 1: the original frequency, 0: divided by factor
    freq = 1.0 / (base ** (np.arange(0, rotary_dim, 2, dtype=np.float64) / rotary_dim))
    return freq / factor * (1.0 - keep) + freq * keep


def yarn_attention_factor(scaling: Mapping[str, Any]) -> float:
    """The factor the cos/sin tables carry: m(mscale) / m(mscale_all_dim) when both are set, else m(1)."""
    factor = float(scaling["factor"])
    mscale, mscale_all = scaling.get("mscale"), scaling.get("mscale_all_dim")
    if mscale and mscale_all:
        return yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all)
    return yarn_mscale(factor)


def yarn_softmax_mscale(scaling: Optional[Mapping[str, Any]]) -> float:
    """DeepSeek's extra softmax scale: m(mscale_all_dim)^2 (1 without YaRN or without mscale_all_dim)."""
    if not scaling or not scaling.get("mscale_all_dim"):
        return 1.0
    m = yarn_mscale(float(scaling["factor"]), float(scaling["mscale_all_dim"]))
    return m * m
