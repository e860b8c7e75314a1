"""The mixture-of-experts settings' rules: every inconsistent MoE field of a config, as data.

Kept apart from the MoE layer (``moe.py``) so that ``TransformerConfig`` can check them without
importing the layer, and the layer can import the config without a circle.
"""
from __future__ import annotations


SCORE_FUNCTIONS = ("softmax", "sigmoid")
BALANCING = ("seq_aux_loss", "aux_loss", "none")
DROP_POLICIES = ("position",)


def moe_config_problems(c):
    """``(field, value, rule)`` for every inconsistent MoE setting of ``c``."""
    out = []
    E, ep = c.num_moe_experts, c.expert_model_parallel_size

    def bad_int(v, lo=1):
        return not isinstance(v, int) or isinstance(v, bool) or v < lo

    if bad_int(ep):
        return [("expert_model_parallel_size", ep, "must be an integer >= 1")]
    if E is None:
        return [("expert_model_parallel_size", ep, "needs num_moe_experts (expert parallelism splits the experts "
                 "of a mixture-of-experts model)")] if ep > 1 else []
    if bad_int(E, 2):
        return [("num_moe_experts", E, "must be an integer >= 2 (or null for a dense model)")]
    k = c.moe_router_topk
    if bad_int(k) or k > E:
        out.append(("moe_router_topk", k, f"must be an integer in [1, num_moe_experts={E}]"))
    for name in ("moe_ffn_hidden_size",):
        v = getattr(c, name)
        if v is not None and bad_int(v):
            out.append((name, v, "must be null or an integer >= 1"))
    shared = c.moe_shared_expert_intermediate_size
    if shared is not None and bad_int(shared, 0):
        out.append(("moe_shared_expert_intermediate_size", shared, "must be null or an integer >= 0"))
    elif shared and shared % c.tensor_model_parallel_size:
        out.append(("moe_shared_expert_intermediate_size", shared,
                    f"must be divisible by tensor_model_parallel_size={c.tensor_model_parallel_size}"))
    if c.moe_router_score_function not in SCORE_FUNCTIONS:
        out.append(("moe_router_score_function", c.moe_router_score_function,
                    f"must be one of {list(SCORE_FUNCTIONS)}"))
    if c.moe_router_load_balancing_type not in BALANCING:
        out.append(("moe_router_load_balancing_type", c.moe_router_load_balancing_type,
                    f"must be one of {list(BALANCING)}"))
    m = c.moe_aux_loss_micro_batches
    if not isinstance(m, int) or isinstance(m, bool) or m < 1:
        out.append(("moe_aux_loss_micro_batches", m, "must be an integer >= 1"))
    elif m > 1 and c.data_parallel_size > 1:
        out.append(("moe_aux_loss_micro_batches", m, f"must be 1 with data_parallel_size={c.data_parallel_size} "
                    "(it reproduces a pipeline's per-microbatch aux_loss on one process)"))
    if c.moe_token_drop_policy not in DROP_POLICIES:
        out.append(("moe_token_drop_policy", c.moe_token_drop_policy,
                    f"must be one of {list(DROP_POLICIES)} (tokens past an expert's capacity are dropped in "
                    f"order; 'probs' is not supported)"))
    groups, gtop = c.moe_router_num_groups, c.moe_router_group_topk
    if groups is not None:
        if bad_int(groups) or E % groups:
            out.append(("moe_router_num_groups", groups, f"must be an integer >= 1 dividing num_moe_experts={E}"))
        elif gtop is None or bad_int(gtop) or gtop > groups:
            out.append(("moe_router_group_topk", gtop, f"must be an integer in [1, moe_router_num_groups={groups}] "
                        "when groups are set"))
        elif isinstance(k, int) and k > gtop * (E // groups):
            out.append(("moe_router_topk", k, f"must be <= moe_router_group_topk x experts per group = "
                        f"{gtop * (E // groups)}"))
    elif gtop is not None:
        out.append(("moe_router_group_topk", gtop, "needs moe_router_num_groups"))
    for name in ("moe_router_topk_scaling_factor", "moe_router_bias_update_rate"):
        v = getattr(c, name)
        if not isinstance(v, (int, float)) or isinstance(v, bool) or v <= 0:
            out.append((name, v, "must be a number > 0"))
    if not isinstance(c.moe_aux_loss_coeff, (int, float)) or isinstance(c.moe_aux_loss_coeff, bool) \
            or c.moe_aux_loss_coeff < 0:
        out.append(("moe_aux_loss_coeff", c.moe_aux_loss_coeff, "must be a number >= 0"))
    cf = c.moe_expert_capacity_factor
    if cf is not None and (not isinstance(cf, (int, float)) or isinstance(cf, bool) or cf <= 0):
        out.append(("moe_expert_capacity_factor", cf, "must be null (dropless) or a number > 0"))
    for name in ("moe_router_norm_topk_prob", "moe_router_enable_expert_bias"):
        if not isinstance(getattr(c, name), bool):
            out.append((name, getattr(c, name), "must be true or false"))
    first = c.moe_first_k_dense_layers
    if bad_int(first, 0) or first >= c.num_layers:
        out.append(("moe_first_k_dense_layers", first, f"must be an integer in [0, num_layers={c.num_layers}) "
                    "(at least one layer must be a mixture of experts)"))
    freq = c.moe_layer_freq
    if isinstance(freq, (list, tuple)):
        if len(freq) != c.num_layers or any(v not in (0, 1) or isinstance(v, float) for v in freq):
            out.append(("moe_layer_freq", list(freq), f"must be an integer >= 1 or a list of num_layers={c.num_layers} "
                        "values 0 (dense layer) / 1 (MoE layer)"))
    elif bad_int(freq):
        out.append(("moe_layer_freq", freq, "must be an integer >= 1 (MoE every N-th layer from layer 0) or a list of "
                    "0/1 per layer"))
    if not any(out_ for out_ in out if out_[0] in ("moe_layer_freq", "moe_first_k_dense_layers")) \
            and not any(c.is_moe_layer(n) for n in range(1, c.num_layers + 1)):
        out.append(("moe_layer_freq", freq if not isinstance(freq, tuple) else list(freq),
                    f"with moe_first_k_dense_layers={first} leaves no mixture-of-experts layer; at least one is needed"))
    if E % ep:
        out.append(("num_moe_experts", E, f"must be divisible by expert_model_parallel_size={ep}"))
    if c.data_parallel_size % ep:
        out.append(("expert_model_parallel_size", ep, f"must divide data_parallel_size={c.data_parallel_size} "
                    "(the expert-parallel groups are carved out of data parallel, as in MindFormers)"))
    return out
