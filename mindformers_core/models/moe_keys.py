"""MindFormers' mixture-of-experts ``model_config`` keys -> ``TransformerConfig`` fields: the one table
every family with Llama-style MoE layers (Qwen3-MoE, DeepSeek-V3) reads.

The names are those of the trainer's schema (Qwen3-MoE / DeepSeek-V3 spellings); the DeepSeek
``moe_config`` block is translated to them in ``training/dialects.py``. Pure Python.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, Optional

__all__ = ["MOE_KEYS", "SHARED_EXPERTS_KEY", "SPARSE_STEP_KEY", "MLP_ONLY_KEY", "is_moe_key", "moe_fields", "sparse_layers"]

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
            "moe_aux_loss_micro_batches": "moe_aux_loss_micro_batches",
            "moe_router_load_balancing_type": "moe_router_load_balancing_type",
            "moe_expert_capacity_factor": "moe_expert_capacity_factor", "moe_token_drop_policy": "moe_token_drop_policy",
            "moe_layer_freq": "moe_layer_freq"}
SHARED_EXPERTS_KEY = "n_shared_experts"   # a count of shared experts (DeepSeek); becomes their total width
# Qwen3-MoE's (Hugging Face's) choice of MoE layers, read into moe_layer_freq (a 0/1 list per layer):
# layer i (0-based) is MoE when it is not in mlp_only_layers and (i + 1) % decoder_sparse_step == 0
SPARSE_STEP_KEY, MLP_ONLY_KEY = "decoder_sparse_step", "mlp_only_layers"


def sparse_layers(num_layers: int, step: Any = 1, mlp_only: Any = ()) -> Any:
    """Hugging Face Qwen3-MoE's MoE layers as ``moe_layer_freq``: 1 (every layer) or a 0/1 list per layer.
    ``ValueError`` naming the key for a step that is not an int >= 1 or layers that are not indices."""
    if step is None:
        step = 1
    if not isinstance(step, int) or isinstance(step, bool) or step < 1:
        raise ValueError(f"{SPARSE_STEP_KEY}={step!r}: must be an integer >= 1 (every step-th layer is MoE)")
    mlp_only = list(mlp_only or [])
    if not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < num_layers for i in mlp_only):
        raise ValueError(f"{MLP_ONLY_KEY}={mlp_only!r}: must be a list of layer indices in [0, {num_layers})")
    if step == 1 and not mlp_only:
        return 1
    return [0 if i in mlp_only or (i + 1) % step else 1 for i in range(num_layers)]


def is_moe_key(key: str) -> bool:
    return key in MOE_KEYS or key in (SHARED_EXPERTS_KEY, SPARSE_STEP_KEY, MLP_ONLY_KEY)


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
    step, only = model_config.get(SPARSE_STEP_KEY), model_config.get(MLP_ONLY_KEY)
    if (step not in (None, 1) or only) and out.get("num_moe_experts") is not None:
        layers = model_config.get("num_layers")
        freq = sparse_layers(layers if isinstance(layers, int) else 0, step, only)
        # moe_layer_freq 1 (every layer) is the schema's default: the Hugging Face keys refine it
        if "moe_layer_freq" in out and out["moe_layer_freq"] not in (1, freq):
            raise ValueError(f"moe_layer_freq={out['moe_layer_freq']!r} and {SPARSE_STEP_KEY}/{MLP_ONLY_KEY} "
                             f"(= {freq!r}) disagree; give one")
        out["moe_layer_freq"] = freq
    return out
