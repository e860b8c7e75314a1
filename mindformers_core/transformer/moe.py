"""Mixture of experts (DeepSeek-V3 / Qwen3-MoE style), written for one card.

``MoELayer`` replaces a layer's MLP: a top-k router picks ``moe_router_topk`` of ``num_moe_experts``
SwiGLU experts per token, the routed experts run on their tokens and the outputs are summed with the
router's weights; optional shared experts (a plain MLP) see every token. A load-balancing loss
(``moe_aux_loss_coeff``) is returned next to the hidden states and added to the training loss.

Parts and what the sharding pass sees (docs/moe.md):

* :class:`TopKRouter` (one ``moe_router`` op): linear gate -> softmax or sigmoid scores -> optional
  group-limited selection (``moe_router_num_groups`` / ``moe_router_group_topk``: a group scores the
  sum of its two best experts) -> top-k on the scores plus the optional expert bias (which steers
  the choice only) -> weights = the chosen scores (renormalized with ``norm_topk_prob``) x
  ``routed_scaling_factor``. Outputs weights (b, s, k), expert ids (b, s, k), each token's score
  distribution (b, s, E) and its routing map (b, s, E) of 0/1.
* :class:`RoutedExperts` (one ``moe_experts`` op): tokens to a padded (E, C, h) buffer, one batched
  SwiGLU per expert, back to tokens (``sharding/expert_dispatch.py``; dropless by default). With
  experts split over the ``ep`` mesh axis the pass swaps in the expert-parallel kernel.
* :class:`LoadBalancingLoss`: plain ops on the router's outputs, so the pass reduces the
  statistics over whatever splits the tokens.

The expert bias is a non-trainable Parameter: :func:`update_expert_bias` moves it after a step from
the tokens each expert received (``tokens_per_expert``, counted by the router on every forward).
"""
from __future__ import annotations

import dataclasses

import numpy as np
import mindspore as ms
from mindspore import Parameter, Tensor, nn, ops

from ..sharding.expert_dispatch import capacity, combine, dispatch, dispatch_indices, swiglu_experts
from .config import TransformerConfig
from .init import normal_parameter
from .mlp import MLP

from .moe_config import BALANCING, DROP_POLICIES, SCORE_FUNCTIONS, moe_config_problems  # noqa: F401 (re-exported)


class TopKRouter(nn.Cell):
    """x (..., h) -> (weights (..., k), expert ids (..., k) int32, scores (..., E), routing map (..., E))."""
    sharding_op = "moe_router"
    sharding_params = ("weight", "expert_bias")
    normal_init_params = ("weight",)

    def __init__(self, config: TransformerConfig):
        super().__init__()
        E, h = config.num_moe_experts, config.hidden_size
        self.num_experts, self.topk = E, config.moe_router_topk
        self.sigmoid = config.moe_router_score_function == "sigmoid"
        self.groups = config.moe_router_num_groups or 1
        self.group_topk = config.moe_router_group_topk or self.groups
        self.grouped = self.groups > 1 and self.group_topk < self.groups
        self.group_size = E // self.groups
        self.norm_topk = config.moe_router_norm_topk_prob
        self.scaling = float(config.moe_router_topk_scaling_factor)
        self.use_bias = config.moe_router_enable_expert_bias
        self.bias_update_rate = float(config.moe_router_bias_update_rate)
        self.init_std = config.init_method_std
        self.weight = normal_parameter(f"TopKRouter:{h}x{E}", (h, E), config.init_method_std, ms.float32, "weight")
        self.expert_bias = Parameter(Tensor(np.zeros((E,), np.float32)), name="expert_bias", requires_grad=False)
        # tokens routed to each expert since the last reset (read and reset by the trainer / bias update)
        self.tokens_per_expert = Parameter(Tensor(np.zeros((E,), np.float32)), name="tokens_per_expert",
                                           requires_grad=False)
        self.forwards = Parameter(Tensor(np.zeros((), np.float32)), name="forwards", requires_grad=False)

    def sharding_attrs(self) -> dict:
        return {"num_experts": self.num_experts, "topk": self.topk}

    def shard(self, config: TransformerConfig):
        return None, None, None

    def construct(self, x):
        lead = x.shape[:-1]
        tokens = x.reshape(-1, x.shape[-1]).astype(ms.float32)
        n = tokens.shape[0]
        logits = ops.matmul(tokens, self.weight)
        if self.sigmoid:
            scores = ops.sigmoid(logits)
            probs = scores / (scores.sum(-1, keepdims=True) + 1e-20)
        else:
            scores = ops.softmax(logits, -1)
            probs = scores
        choice = ops.stop_gradient(scores)
        if self.use_bias:
            choice = choice + self.expert_bias
        if self.grouped:
            grouped = choice.reshape(n, self.groups, self.group_size)
            best = ops.topk(grouped, min(2, self.group_size))[0].sum(-1)               # (n, groups)
            keep = ops.one_hot(ops.topk(best, self.group_topk)[1], self.groups,
                               ops.ones((), ms.float32), ops.zeros((), ms.float32)).sum(1)
            keep = ops.repeat_interleave(keep, self.group_size, 1)                    # (n, E)
            choice = ops.select(keep > 0, choice, ops.full_like(choice, -1.0e30))
        index = ops.topk(choice, self.topk)[1].astype(ms.int32)
        weights = ops.gather_elements(scores, 1, index)
        if self.norm_topk:
            weights = weights / (weights.sum(-1, keepdims=True) + 1e-20)
        if self.scaling != 1.0:
            weights = weights * self.scaling
        routing_map = ops.one_hot(index, self.num_experts, ops.ones((), ms.float32),
                                  ops.zeros((), ms.float32)).sum(1)
        routing_map = ops.depend(routing_map, ops.assign_add(self.tokens_per_expert,
                                                             ops.stop_gradient(routing_map.sum(0))))
        routing_map = ops.depend(routing_map, ops.assign_add(self.forwards, ops.ones((), ms.float32)))
        return (weights.reshape(lead + (self.topk,)), index.reshape(lead + (self.topk,)),
                probs.reshape(lead + (self.num_experts,)), routing_map.reshape(lead + (self.num_experts,)))


class RoutedExperts(nn.Cell):
    """(x (..., h), weights (..., k), expert ids (..., k)) -> (..., h): each token's k expert
    outputs, weighted and summed. Expert e is ``silu(x W_gate[e]) * (x W_up[e]) @ W_down[e]``."""
    sharding_op = "moe_experts"
    sharding_params = ("w_gate", "w_up", "w_down")
    normal_init_params = ("w_gate", "w_up", "w_down")

    def __init__(self, config: TransformerConfig):
        super().__init__()
        E, h = config.num_moe_experts, config.hidden_size
        f = config.moe_ffn_hidden_size or config.ffn_hidden_size
        self.num_experts, self.hidden, self.ffn = E, h, f
        self.capacity_factor = config.moe_expert_capacity_factor
        self.init_std = config.init_method_std
        std, dtype = config.init_method_std, config.ms_params_dtype
        self.w_gate = normal_parameter(f"RoutedExperts:gate:{E}x{h}x{f}", (E, h, f), std, dtype, "w_gate")
        self.w_up = normal_parameter(f"RoutedExperts:up:{E}x{h}x{f}", (E, h, f), std, dtype, "w_up")
        self.w_down = normal_parameter(f"RoutedExperts:down:{E}x{f}x{h}", (E, f, h), std, dtype, "w_down")
        self.compute_dtype = config.ms_compute_dtype

    def sharding_attrs(self) -> dict:
        return {"num_experts": self.num_experts, "capacity_factor": self.capacity_factor}

    def shard(self, config: TransformerConfig):
        if getattr(config, "expert_model_parallel_size", 1) == 1:
            return None, None, None   # or an ExpertParallel() plan style splits them
        L = config.layout
        return None, None, {n: L("ep", "None", "None") for n in self.sharding_params}

    def expert_weights(self, dtype):
        """(w_gate, w_up, w_down) as the experts compute with them (the expert-parallel kernel reads them here
        too; LoRA on the experts adds its low-rank deltas in an override, peft/lora.py)."""
        return self.w_gate.astype(dtype), self.w_up.astype(dtype), self.w_down.astype(dtype)

    def construct(self, x, weights, index):
        h, k = x.shape[-1], index.shape[-1]
        tokens = x.reshape(-1, h).astype(self.compute_dtype)
        n = tokens.shape[0]
        cap = capacity(n, k, self.num_experts, self.capacity_factor)
        slot, source = dispatch_indices(index.reshape(-1), self.num_experts, cap, k)
        buffer = dispatch(tokens, source).reshape(self.num_experts, cap, h)
        out = swiglu_experts(buffer, *self.expert_weights(self.compute_dtype))
        y = combine(out.reshape(-1, h), slot, weights.reshape(n, k))
        return y.reshape(x.shape).astype(x.dtype)


class RoutingStatistics(nn.Cell):
    """(scores, routing map) (b, s, E) -> (load f, mean score P): per sequence (b, E) for the
    sequence-level loss, over all tokens (E,) for the global one. ``f`` is the fraction of the
    token's k choices that went to each expert, times E (1 everywhere when perfectly balanced)."""

    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.per_sequence = config.moe_router_load_balancing_type == "seq_aux_loss"
        self.load_scale = float(config.num_moe_experts) / config.moe_router_topk
        self.groups = int(config.moe_aux_loss_micro_batches)

    def construct(self, scores, routing_map):
        if self.per_sequence:
            return routing_map.mean(1) * self.load_scale, scores.mean(1)
        if self.groups > 1:     # (m, E): each group of b/m rows (one microbatch of a pipeline) on its own
            b, s, e = scores.shape
            if b % self.groups:
                raise ValueError(f"moe_aux_loss_micro_batches={self.groups}: must divide the batch's {b} rows")
            shape = (self.groups, b // self.groups, s, e)
            return (routing_map.reshape(shape).mean((1, 2)) * self.load_scale,
                    scores.reshape(shape).mean((1, 2)))
        return routing_map.mean((0, 1)) * self.load_scale, scores.mean((0, 1))


class AuxLossProbe(nn.Cell):
    """Identity on the load-balancing loss that adds its value to ``aux_sum`` (and 1 to ``forwards``)
    for the per-step log; one ``identity`` op for the sharding pass (the value it records on a rank is
    that rank's part: the trainer averages over the ranks)."""
    sharding_op = "identity"
    sharding_params = ()

    def __init__(self):
        super().__init__()
        self.aux_sum = Parameter(Tensor(np.zeros((), np.float32)), name="aux_sum", requires_grad=False)
        self.forwards = Parameter(Tensor(np.zeros((), np.float32)), name="forwards", requires_grad=False)

    def sharding_attrs(self) -> dict:
        return {}

    def shard(self, config):
        return None, None, None

    def construct(self, x):
        x = ops.depend(x, ops.assign_add(self.aux_sum, ops.stop_gradient(x).reshape(()).astype(ms.float32)))
        return ops.depend(x, ops.assign_add(self.forwards, ops.ones((), ms.float32)))


class LoadBalancingLoss(nn.Cell):
    """``coeff * sum_e f_e * P_e`` (averaged over sequences for ``seq_aux_loss``, over the row groups for
    ``aux_loss`` with ``moe_aux_loss_micro_batches`` > 1)."""

    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.statistics = RoutingStatistics(config)
        self.per_sequence = self.statistics.per_sequence
        self.coeff = float(config.moe_aux_loss_coeff)
        self.probe = AuxLossProbe()

    def construct(self, scores, routing_map):
        load, mean_score = self.statistics(scores, routing_map)
        loss = (load * mean_score).sum(-1)
        if self.per_sequence or self.statistics.groups > 1:
            loss = loss.mean()
        return self.probe(loss * self.coeff)


class MoELayer(nn.Cell):
    """(b, s, h) -> (b, s, h), or ((b, s, h), aux loss) when ``returns_aux``."""

    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.router = TopKRouter(config)
        self.experts = RoutedExperts(config)
        shared = config.moe_shared_expert_intermediate_size
        self.has_shared = bool(shared)
        if self.has_shared:
            shared_config = dataclasses.replace(config, ffn_hidden_size=shared, num_moe_experts=None,
                                                expert_model_parallel_size=1)
            self.shared_experts = MLP(shared_config)
        self.returns_aux = config.moe_aux_loss_coeff > 0 and config.moe_router_load_balancing_type != "none"
        if self.returns_aux:
            self.load_balancing = LoadBalancingLoss(config)

    def construct(self, x):
        weights, index, scores, routing_map = self.router(x)
        y = self.experts(x, weights, index)
        if self.has_shared:
            y = y + self.shared_experts(x)
        if self.returns_aux:
            return y, self.load_balancing(scores, routing_map)
        return y


def routers_of(model: nn.Cell):
    """``[(path, TopKRouter)]`` of a model, in model order."""
    return [(path, cell) for path, cell in model.cells_and_names() if isinstance(cell, TopKRouter)]


def expert_bias_update(bias: np.ndarray, tokens_per_expert: np.ndarray, rate: float) -> np.ndarray:
    """The aux-loss-free balancing step: raise the bias of under-loaded experts, lower over-loaded
    ones, by ``rate`` (``bias + rate * sign(mean load - load)``)."""
    load = np.asarray(tokens_per_expert, np.float64)
    return (np.asarray(bias, np.float64) + rate * np.sign(load.mean() - load)).astype(np.float32)


def update_expert_bias(model: nn.Cell, tokens_per_expert=None, rate=None) -> None:
    """After an optimizer step: move every router's expert bias (when enabled) from the tokens its
    experts received (``tokens_per_expert[i]`` for the i-th router; default: each router's own
    count, which on several ranks must first be summed over the data-parallel ranks)."""
    for i, (_, router) in enumerate(routers_of(model)):
        if not router.use_bias:
            continue
        load = router.tokens_per_expert.asnumpy() if tokens_per_expert is None else tokens_per_expert[i]
        step = rate if rate is not None else router.bias_update_rate
        router.expert_bias.set_data(Tensor(expert_bias_update(router.expert_bias.asnumpy(), load, step)))
