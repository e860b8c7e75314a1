"""MindFormers' mixture-of-experts ``model_config`` keys -> ``TransformerConfig`` fields: the one table
every family with Llama-style MoE layers (Qwen3-MoE, DeepSeek-V3) reads.

The names are those of the trainer's schema (Qwen3-MoE / DeepSeek-V3 spellings); the DeepSeek
``moe_config`` block is translated to them in ``training/dialects.py``. Pure Python.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, Optional

__all__ = ["MOE_KEYS", "SHARED_EXPERTS_KEY", "is_moe_key", "moe_fields"]

MOE_KEYS = {"num_experts": "num_moe_experts", "n_routed_experts": "num_moe_experts",
            "num_experts_per_tok": "moe_router_topk", "moe_router_topk": "moe_router_topk",
            "moe_intermediate_size": "moe_ffn_hidden_size", "moe_ffn_hidden_size": "moe_ffn_hidden_size",
            "moe_shared_expert_intermediate_size": "moe_shared_expert_intermediate_size",
            "first_k_dense_replace": "moe_first_k_dense_layers",
            "routed_scaling_factor": "moe_router_topk_scaling_factor",
            "scoring_func": "moe_router_score_function", "norm_topk_prob": "moe_router_norm_topk_prob",
            "n_group": "moe_router_num_groups", "topk_group": "moe_router_group_topk",
            "moe_router_enable_expert_bias": "moe_router_enable_expert_bias",
            "moe_router_bias_update_rate": "moe_router_bias_update_rate", "moe_aux_loss_coeff": "moe_aux_loss_coeff",
            "moe_router_load_balancing_type": "moe_router_load_balancing_type",
            "moe_expert_capacity_factor": "moe_expert_capacity_factor", "moe_token_drop_policy": "moe_token_drop_policy"}
SHARED_EXPERTS_KEY = "n_shared_experts"   # a count of shared experts (DeepSeek); becomes their total width


def is_moe_key(key: str) -> bool:
    return key in MOE_KEYS or key == SHARED_EXPERTS_KEY


def moe_fields(model_config: Dict[str, Any], dense_width: Callable[[], int]) -> Dict[str, Any]:
    """The ``TransformerConfig`` fields the MoE keys of ``model_config`` give (keys set to None are
    absent). One expert is a dense model: no MoE field at all. ``n_shared_experts`` is
    turned into ``moe_shared_expert_intermediate_size`` = count x one expert's width (the routed
    expert width, else ``dense_width()``) unless that is given."""
    out: Dict[str, Any] = {}
    shared: Optional[int] = None
    for key, value in model_config.items():
        if key == SHARED_EXPERTS_KEY:
            shared = value
        elif key in MOE_KEYS and value is not None:
            out[MOE_KEYS[key]] = value
    if out.get("num_moe_experts") is not None and out["num_moe_experts"] <= 1:
        return {}
    if shared and out.get("num_moe_experts") is not None and out.get("moe_shared_expert_intermediate_size") is None:
        out["moe_shared_expert_intermediate_size"] = int(shared) * int(out.get("moe_ffn_hidden_size") or dense_width())
    return out
