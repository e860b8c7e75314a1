"""Mixture of experts on one process: the router against NumPy (top-k, groups, bias, scaling), the
load-balancing loss against a hand computation, the dispatch/combine permutation with uneven
counts and capacity drops, the layer against a per-expert NumPy loop, named config errors and the
expert-parallel sharding plan (pure planning, no process group)."""
import numpy as np
import pytest
import mindspore as ms
from mindspore import Tensor

from mindformers_core.sharding import ExpertParallel, expert_mesh
from mindformers_core.sharding.expert_dispatch import capacity, combine, dispatch, dispatch_indices
from mindformers_core.sharding.expert_parallel import all_to_all_bytes
from mindformers_core.sharding.parallelizer import plan_sharding
from mindformers_core.sharding.propagation import PlanError
from mindformers_core.transformer import GPTModel, TransformerConfig
from mindformers_core.transformer.moe import (LoadBalancingLoss, MoELayer, RoutedExperts, TopKRouter,
                                              expert_bias_update, routers_of, update_expert_bias)


def cfg(**kw):
    base = dict(num_layers=2, hidden_size=16, ffn_hidden_size=32, num_attention_heads=2, vocab_size=64,
                seq_length=8, num_moe_experts=8, moe_router_topk=2, moe_ffn_hidden_size=12)
    base.update(kw)
    return TransformerConfig(**base)


def np_router(x, w, k, sigmoid=False, groups=1, group_topk=None, bias=None, norm=True, scale=1.0):
    logits = x.reshape(-1, x.shape[-1]).astype(np.float64) @ w
    if sigmoid:
        scores = 1 / (1 + np.exp(-logits))
    else:
        e = np.exp(logits - logits.max(-1, keepdims=True))
        scores = e / e.sum(-1, keepdims=True)
    choice = scores + (0 if bias is None else bias)
    n, E = scores.shape
    if groups > 1 and group_topk < groups:
        g = choice.reshape(n, groups, E // groups)
        best = np.sort(g, -1)[..., ::-1][..., :min(2, E // groups)].sum(-1)
        keep = np.zeros((n, groups), bool)
        for t in range(n):
            keep[t, np.argsort(-best[t], kind="stable")[:group_topk]] = True
        choice = np.where(np.repeat(keep, E // groups, 1), choice, -1e30)
    idx = np.argsort(-choice, -1, kind="stable")[:, :k]
    wts = np.take_along_axis(scores, idx, -1)
    if norm:
        wts = wts / wts.sum(-1, keepdims=True)
    return wts * scale, idx, scores


@pytest.mark.parametrize("kw", [
    {},
    {"moe_router_score_function": "sigmoid", "moe_router_num_groups": 4, "moe_router_group_topk": 2,
     "moe_router_topk_scaling_factor": 2.5},
    {"moe_router_norm_topk_prob": False, "moe_router_topk": 3},
    {"moe_router_score_function": "sigmoid", "moe_router_enable_expert_bias": True},
])
def test_router_matches_numpy(kw):
    c = cfg(**kw)
    ms.set_seed(3)
    router = TopKRouter(c)
    rng = np.random.RandomState(0)
    x = rng.randn(2, 8, 16).astype(np.float32)
    bias = None
    if c.moe_router_enable_expert_bias:
        bias = np.linspace(-0.3, 0.3, 8).astype(np.float32)
        router.expert_bias.set_data(Tensor(bias))
    w = router.weight.asnumpy().astype(np.float64) * 30          # sharper scores: no near ties
    router.weight.set_data(Tensor(w.astype(np.float32)))
    wts, idx, probs, rmap = (t.asnumpy() for t in router(Tensor(x)))
    want_w, want_i, scores = np_router(x, w, c.moe_router_topk, c.moe_router_score_function == "sigmoid",
                                       c.moe_router_num_groups or 1, c.moe_router_group_topk, bias,
                                       c.moe_router_norm_topk_prob, c.moe_router_topk_scaling_factor)
    assert wts.shape == (2, 8, c.moe_router_topk) and idx.dtype == np.int32
    np.testing.assert_array_equal(np.sort(idx.reshape(-1, c.moe_router_topk), -1), np.sort(want_i, -1))
    order = np.argsort(idx.reshape(-1, c.moe_router_topk), -1)
    np.testing.assert_allclose(np.take_along_axis(wts.reshape(-1, c.moe_router_topk), order, -1),
                               np.take_along_axis(want_w, np.argsort(want_i, -1), -1), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(probs.reshape(-1, 8), scores / scores.sum(-1, keepdims=True), rtol=1e-5, atol=1e-7)
    assert (rmap.sum(-1) == c.moe_router_topk).all()
    np.testing.assert_allclose(router.tokens_per_expert.asnumpy(), rmap.reshape(-1, 8).sum(0))
    if c.moe_router_num_groups:   # every token's experts lie in at most group_topk groups
        groups = idx.reshape(-1, c.moe_router_topk) // (8 // c.moe_router_num_groups)
        assert max(len(set(g)) for g in groups) <= c.moe_router_group_topk


def test_load_balancing_loss_by_hand():
    # 2 sequences x 2 tokens, 4 experts, top-2: f_e = fraction of the 2 x tokens choices x E / k
    probs = np.array([[[0.4, 0.3, 0.2, 0.1], [0.1, 0.2, 0.3, 0.4]],
                      [[0.25, 0.25, 0.25, 0.25], [0.7, 0.1, 0.1, 0.1]]], np.float32)
    rmap = np.array([[[1, 1, 0, 0], [0, 0, 1, 1]], [[1, 0, 1, 0], [1, 1, 0, 0]]], np.float32)
    # f_e = mean over the sequence's tokens of map_e, x E / k = 2 (1 everywhere when balanced);
    # P_e = mean over its tokens of the scores. Sequence 0: f = 1, P = 0.25 -> 1;
    # sequence 1: f = (2, 1, 1, 0), P = (0.475, 0.175, 0.175, 0.175) -> 0.95 + 0.35 = 1.3
    f0, p0 = np.array([1, 1, 1, 1]), np.array([0.25, 0.25, 0.25, 0.25])
    f1, p1 = np.array([2, 1, 1, 0]), np.array([0.475, 0.175, 0.175, 0.175])
    seq = 0.1 * ((f0 * p0).sum() + (f1 * p1).sum()) / 2           # = 0.1 * (1 + 1.3) / 2
    assert abs(seq - 0.115) < 1e-9
    fg = np.array([3, 2, 2, 1]) / 4 * 2
    pg = probs.reshape(-1, 4).mean(0)
    glob = 0.1 * (fg * pg).sum()
    for kind, want in (("seq_aux_loss", seq), ("aux_loss", glob)):
        loss = LoadBalancingLoss(cfg(num_moe_experts=4, moe_aux_loss_coeff=0.1, moe_router_load_balancing_type=kind))
        assert abs(float(loss(Tensor(probs), Tensor(rmap))) - want) < 1e-6, kind


@pytest.mark.parametrize("cap_factor", [None, 1.0, 0.5])
def test_dispatch_combine_round_trip_uneven_counts(cap_factor):
    E, k, N, h = 4, 2, 7, 3
    # uneven: expert 0 is chosen by every token, expert 3 by one
    idx = np.array([[0, 1], [0, 2], [1, 0], [0, 2], [2, 0], [0, 1], [3, 0]], np.int32)
    x = np.random.RandomState(1).randn(N, h).astype(np.float32)
    p = np.random.RandomState(2).rand(N, k).astype(np.float32)
    C = capacity(N, k, E, cap_factor)
    assert C == (N if cap_factor is None else int(np.ceil(cap_factor * N * k / E)))
    slot, src = dispatch_indices(Tensor(idx.reshape(-1)), E, C, k)
    buf = dispatch(Tensor(x), src).asnumpy().reshape(E, C, h)
    counts = np.bincount(idx.reshape(-1), minlength=E)
    for e in range(E):   # expert e's slots hold its first min(count, C) tokens in token order, then zeros
        tokens = [t for t in range(N) if e in idx[t]][:C]
        np.testing.assert_array_equal(buf[e, :len(tokens)], x[tokens])
        assert not buf[e, len(tokens):].any()
        assert len(tokens) == min(counts[e], C)
    y = combine(Tensor(buf.reshape(E * C, h)), slot, Tensor(p)).asnumpy()
    kept = np.zeros((N, k), bool)
    for e in range(E):
        rows = [(t, j) for t in range(N) for j in range(k) if idx[t, j] == e][:C]
        for t, j in rows:
            kept[t, j] = True
    np.testing.assert_allclose(y, x * (p * kept).sum(1, keepdims=True), rtol=1e-6, atol=1e-6)
    if cap_factor is None:
        assert kept.all()
    else:
        assert not kept.all()


def np_moe(x, layer, c):
    r = layer.router
    wts, idx, _ = np_router(x, r.weight.asnumpy().astype(np.float64), c.moe_router_topk)
    g, u, d = (getattr(layer.experts, n).asnumpy().astype(np.float64) for n in ("w_gate", "w_up", "w_down"))
    t = x.reshape(-1, x.shape[-1]).astype(np.float64)
    out = np.zeros_like(t)
    for e in range(c.num_moe_experts):
        a = t @ g[e]
        y = (a / (1 + np.exp(-a)) * (t @ u[e])) @ d[e]
        out += y * ((idx == e) * wts).sum(-1, keepdims=True)
    return out.reshape(x.shape)


def test_moe_layer_matches_a_per_expert_loop_and_jit_matches_pynative():
    c = cfg()
    ms.set_seed(5)
    layer = MoELayer(c)
    x = np.random.RandomState(4).randn(2, 8, 16).astype(np.float32)
    got = layer(Tensor(x)).asnumpy()
    np.testing.assert_allclose(got, np_moe(x, layer, c), rtol=1e-4, atol=1e-6)
    model = GPTModel(cfg(moe_aux_loss_coeff=0.01, moe_shared_expert_intermediate_size=16, moe_first_k_dense_layers=1))
    ids = Tensor(np.random.RandomState(0).randint(0, 64, (2, 8)).astype(np.int32))
    grad = ms.value_and_grad(model, None, model.trainable_params())
    loss, grads = grad(ids, ids)
    loss_j, grads_j = ms.jit(grad)(ids, ids)
    assert abs(float(loss) - float(loss_j)) < 1e-6
    assert max(float(np.abs(a.asnumpy() - b.asnumpy()).max()) for a, b in zip(grads, grads_j)) < 1e-6
    names = [p.name for p in model.trainable_params()]
    assert "decoder.layers.1.mlp.experts.w_gate" in names and "decoder.layers.0.mlp.linear_fc1_gate.weight" in names
    assert "decoder.layers.1.mlp.shared_experts.linear_fc2.weight" in names
    # the aux loss is in the loss: without it the loss is smaller
    plain = GPTModel(cfg(moe_shared_expert_intermediate_size=16, moe_first_k_dense_layers=1))
    for p, q in zip(plain.trainable_params(), model.trainable_params()):
        p.set_data(q.data)
    assert float(plain(ids, ids)) < float(loss)


def test_expert_bias_update_moves_towards_balance():
    bias = np.zeros(4, np.float32)
    assert expert_bias_update(bias, [10, 2, 4, 4], 0.1).tolist() == pytest.approx([-0.1, 0.1, 0.1, 0.1])
    model = GPTModel(cfg(moe_router_enable_expert_bias=True, moe_router_bias_update_rate=0.01,
                         moe_first_k_dense_layers=1))
    ids = Tensor(np.random.RandomState(0).randint(0, 64, (2, 8)).astype(np.int32))
    model(ids, ids)
    [(path, router)] = routers_of(model)
    assert path == "decoder.layers.1.mlp.router"
    load = router.tokens_per_expert.asnumpy()
    assert load.sum() == 2 * 8 * 2                      # every token's 2 choices counted once
    update_expert_bias(model)
    np.testing.assert_allclose(router.expert_bias.asnumpy(), 0.01 * np.sign(load.mean() - load))


@pytest.mark.parametrize("kw, field", [
    ({"num_moe_experts": 1}, "num_moe_experts=1"),
    ({"moe_router_topk": 9}, "moe_router_topk=9"),
    ({"moe_router_num_groups": 3}, "moe_router_num_groups=3"),
    ({"moe_router_num_groups": 4, "moe_router_group_topk": 5}, "moe_router_group_topk=5"),
    ({"moe_router_num_groups": 4, "moe_router_group_topk": 1, "moe_router_topk": 3}, "moe_router_topk=3"),
    ({"moe_router_score_function": "relu"}, "moe_router_score_function='relu'"),
    ({"moe_router_load_balancing_type": "sinkhorn"}, "moe_router_load_balancing_type='sinkhorn'"),
    ({"moe_token_drop_policy": "probs"}, "moe_token_drop_policy='probs'"),
    ({"moe_expert_capacity_factor": 0}, "moe_expert_capacity_factor=0"),
    ({"moe_first_k_dense_layers": 2}, "moe_first_k_dense_layers=2"),
    ({"expert_model_parallel_size": 3, "data_parallel_size": 3}, "num_moe_experts=8"),
    ({"expert_model_parallel_size": 2}, "expert_model_parallel_size=2.*data_parallel_size=1"),
    ({"num_moe_experts": None, "expert_model_parallel_size": 2, "data_parallel_size": 2}, "needs num_moe_experts"),
])
def test_named_config_errors(kw, field):
    with pytest.raises(ValueError, match=field):
        cfg(**kw)


def test_expert_parallel_plan_without_process_groups():
    c = cfg(data_parallel_size=4, expert_model_parallel_size=2, moe_first_k_dense_layers=1,
            tensor_model_parallel_size=2)
    assert c.layout.alias_name == ("edp", "ep", "cp", "tp") and c.layout("dp", "None").dims == (("edp", "ep"), ())
    model = GPTModel(c)
    ids = np.zeros((4, 8), np.int32)
    plan = plan_sharding(model, c, ids, ids)
    assert plan.grad_axes["decoder.layers.1.mlp.experts.w_down"] == ("edp",)
    assert plan.grad_axes["decoder.layers.1.mlp.router.weight"] == ("edp", "ep")
    assert plan.param_layouts["decoder.layers.1.mlp.experts.w_up"].dims == (("ep",), (), ())
    assert "local kernel: expert_parallel" in plan.explain()
    # a style does the same for a model without shard() declarations on its experts
    mesh = expert_mesh(4, 1, 1, 2)
    layer = MoELayer(cfg())
    styled = plan_sharding(layer, None, np.zeros((4, 8, 16), np.float32), mesh=mesh,
                           plan={"experts": ExpertParallel()})
    assert styled.param_layouts["experts.w_gate"].dims == (("ep",), (), ())
    with pytest.raises(PlanError, match="ExpertParallel"):
        plan_sharding(MoELayer(cfg()), None, np.zeros((4, 8, 16), np.float32), mesh=mesh,
                      plan={"router": ExpertParallel()})
    # tokens not split over ep: named
    with pytest.raises(PlanError, match="tokens .* are not"):
        plan_sharding(MoELayer(cfg()), None, np.zeros((4, 8, 16), np.float32), mesh=mesh,
                      plan={"experts": ExpertParallel()}, input_layouts=[mesh("None", "None", "None")])
    assert all_to_all_bytes(8, 16, 32, 2) == 4 * 1 * 4 * 16 * 32 * 4


def test_experts_cell_is_one_op_with_declared_ep_weights():
    c = cfg(data_parallel_size=2, expert_model_parallel_size=2)
    weights = RoutedExperts(c).shard(c)[2]
    assert set(weights) == {"w_gate", "w_up", "w_down"} and weights["w_gate"].dims == (("ep",), (), ())
    assert RoutedExperts(cfg()).shard(cfg()) == (None, None, None)
