"""Context parallelism in one process. Pure NumPy (milliseconds): the online-softmax block combination
against one full softmax (fully masked blocks and rows included), the ring schedule (zigzag load
balance, skipped blocks) replayed against plain causal attention, storage order, the named errors.
Then, nothing communicated: the attention op rule, the plan of a cp2 x tp2 GPT (sequence over cp,
gradients summed over cp, zigzag rotary positions) and TransformerConfig's context-parallel errors."""
import numpy as np
import pytest

from mindformers_core.common import sequence_placement as sp


def _softmax_attention(q, k, v, mask):
    s = q @ np.swapaxes(k, -1, -2) + mask
    s = s - s.max(-1, keepdims=True)
    p = np.exp(s)
    return (p / p.sum(-1, keepdims=True)) @ v


def test_block_combination_equals_full_softmax_with_masked_blocks():
    rng = np.random.RandomState(0)
    q, k, v = rng.randn(2, 6, 8), rng.randn(2, 20, 8), rng.randn(2, 20, 8)
    mask = np.where(rng.rand(6, 20) < 0.4, -np.inf, 0.0)
    mask[:, 5:10] = -np.inf            # a fully masked key block
    mask[0, :] = -np.inf               # row 0 keeps one key only, in the last block
    mask[0, 19] = 0.0
    mask[:, 0] = 0.0                   # every row sees at least one key
    want = _softmax_attention(q, k, v, mask)
    bounds = [0, 5, 10, 13, 20]
    o = lse = None
    for a, b in zip(bounds[:-1], bounds[1:]):
        ob, lb = sp.block_attention_numpy(q, k[:, a:b], v[:, a:b], mask[:, a:b])
        if a == 5:
            assert np.isneginf(lb).all() and not ob.any()     # the masked block contributes nothing
        o, lse = (ob, lb) if o is None else sp.merge_blocks_numpy(o, lse, ob, lb)
    np.testing.assert_allclose(o, want, rtol=1e-12, atol=1e-12)
    # merging in any order gives the same result (associative and commutative)
    parts = [sp.block_attention_numpy(q, k[:, a:b], v[:, a:b], mask[:, a:b]) for a, b in zip(bounds[:-1], bounds[1:])]
    o2, l2 = parts[3]
    for ob, lb in (parts[1], parts[0], parts[2]):
        o2, l2 = sp.merge_blocks_numpy(o2, l2, ob, lb)
    np.testing.assert_allclose(o2, want, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(l2, lse, rtol=1e-12)


@pytest.mark.parametrize("cp", [1, 2, 4])
@pytest.mark.parametrize("balanced", [True, False])
def test_ring_schedule_replayed_in_numpy_equals_causal_attention(cp, balanced):
    rng = np.random.RandomState(cp)
    s, d = 32, 4
    q, k, v = rng.randn(3, s, d), rng.randn(3, s, d), rng.randn(3, s, d)
    pos = sp.storage_positions(s, cp, "colossal", None, balanced)
    want = _softmax_attention(q, k, v, np.where(np.arange(s)[None] > np.arange(s)[:, None], -np.inf, 0.0))
    got = sp.ring_attention_numpy(sp.to_storage_order(q, pos), sp.to_storage_order(k, pos),
                                  sp.to_storage_order(v, pos), cp, balanced)
    np.testing.assert_allclose(sp.from_storage_order(got, pos), want, rtol=1e-12, atol=1e-12)


def test_zigzag_storage_order_and_balanced_work():
    pos = sp.storage_positions(16, 2)
    assert list(pos) == [0, 1, 2, 3, 12, 13, 14, 15, 4, 5, 6, 7, 8, 9, 10, 11]
    assert sorted(sp.storage_positions(64, 4)) == list(range(64))
    assert list(sp.storage_positions(16, 2, load_balance=False)) == list(range(16))
    assert list(sp.storage_positions(16, 4, "ulysses")) == list(range(16))      # a ring of one
    hybrid = sp.storage_positions(16, 4, "hybrid", 2)                              # zigzag over a ring of 2
    assert list(hybrid) == list(pos)
    # balanced: every member computes 1 causal block + (ring-1) half blocks; unbalanced: member i
    # computes i full blocks and skips the rest (skipped blocks are not computed at all)
    for ring in (2, 4, 8):
        for m in range(ring):
            kinds = [k for _, k in sp.ring_schedule(ring, m, True)]
            assert kinds[0] == sp.CAUSAL and all(k in (sp.KV_HEAD, sp.Q_TAIL) for k in kinds[1:])
            kinds = [k for _, k in sp.ring_schedule(ring, m, False)]
            assert kinds.count(sp.FULL) == m and kinds.count(sp.SKIP) == ring - 1 - m
    # the step-0 mask is the same on every member and matches the true positions
    for m in range(4):
        mine = pos_of = sp.storage_positions(64, 4)[m * 16:(m + 1) * 16]
        local = sp.local_causal_positions(16, 4, True)
        np.testing.assert_array_equal(sp.causal_mask_array(local), sp.causal_mask_array(pos_of))
        assert len(mine) == 16


def test_named_errors():
    assert sp.problems(64, 2, 8, 8) == []
    (field, value, rule), = sp.problems(36, 4, 8, 8)
    assert field == "seq_length" and value == 36 and "2 x context_parallel = 8" in rule
    assert sp.problems(36, 4, 8, 8, load_balance=False) == []
    (field, value, rule), = sp.problems(64, 4, 6, 6, algorithm="ulysses")
    assert field == "num_attention_heads" and "Ulysses degree 4" in rule
    (field, value, rule), = sp.problems(64, 4, 8, 8, algorithm="hybrid", ulysses_degree=3)
    assert field == "ulysses_degree_in_cp" and value == 3
    (field, value, rule), = sp.problems(64, 2, 8, 8, algorithm="zigzag")
    assert field == "context_parallel_algo" and "colossal" in rule
    assert sp.normalize_algorithm("Ring") == "colossal"


def test_attention_rule_selects_the_context_parallel_kernel():
    from mindformers_core.sharding import Layout, infer
    mesh = Layout((2, 2, 2), ("dp", "cp", "tp"))
    q, kv = (8, 8, 32, 16), (8, 4, 32, 16)
    res = infer("scaled_dot_product_attention", (mesh("dp", "tp", "cp", "None"),) * 3, (q, kv, kv))
    assert res.local.name == "context_parallel_attention" and res.local.attrs["seq_axes"] == ("cp",)
    assert res.local.attrs["local_q"] == (4, 4, 16, 16) and res.local.attrs["local_kv"] == (4, 2, 16, 16)
    assert res.output.describe() == mesh("dp", "cp", "tp").describe()
    plain = infer("scaled_dot_product_attention", (mesh("dp", "tp", "None", "None"),) * 3, (q, kv, kv))
    assert plain.local is None                                   # heads split only: the op runs as is
    gathered = infer("scaled_dot_product_attention", (mesh("dp", "None", "tp", "None"),) * 3, (q, kv, kv))
    assert gathered.local is None and gathered.redistributions()  # a non-cp sequence split is gathered first


def test_gpt_plan_splits_the_sequence_over_cp_and_sums_gradients_over_cp():
    """One process, nothing communicated: the plan of a cp2 x tp2 GPT."""
    from mindformers_core.sharding import plan_sharding
    from mindformers_core.transformer import GPTModel, TransformerConfig
    cfg = TransformerConfig(num_layers=1, hidden_size=32, num_attention_heads=4, num_query_groups=2,
                            vocab_size=64, seq_length=16, context_parallel_size=2, tensor_model_parallel_size=2)
    ids = np.zeros((2, 16), np.int32)
    plan = plan_sharding(GPTModel(cfg), cfg, ids, ids)
    text = plan.explain()
    assert "local kernel: context_parallel_attention" in text
    assert plan.input_layouts[0].describe() == cfg.layout("None", "cp").describe()
    assert all("cp" in axes for axes in plan.grad_axes.values())
    # the rotary tables hold the zigzag positions: storage slot 4 is position 12 (chunks 0, 3 | 1, 2)
    assert list(cfg.token_positions()[:8]) == [0, 1, 2, 3, 12, 13, 14, 15]


def test_transformer_config_names_context_parallel_errors():
    from mindformers_core.transformer import TransformerConfig
    base = dict(num_layers=1, hidden_size=48, num_attention_heads=6, vocab_size=64, seq_length=48)
    with pytest.raises(ValueError, match=r"num_attention_heads=6: must be divisible by the Ulysses degree 4"):
        TransformerConfig(**base, context_parallel_size=4, context_parallel_algo="ulysses")
    with pytest.raises(ValueError, match=r"seq_length=36: must be divisible by 2 x context_parallel = 8"):
        TransformerConfig(**dict(base, seq_length=36), context_parallel_size=4)
    with pytest.raises(ValueError, match=r"context_parallel_algo='zigzag'"):
        TransformerConfig(**base, context_parallel_size=2, context_parallel_algo="zigzag")
    assert TransformerConfig(**base, context_parallel_size=2, context_parallel_algo="ring").context_parallel_algo == "colossal"


def test_ring_kernel_backward_runs_inside_a_graph_differentiated_from_pynative():
    """hsdp level3 islands and jit pipeline stages compile a unit with ``ms.jit`` and take its gradient
    from PyNative. MindSpore 2.10 refuses there a Cell ``bprop`` reading a Parameter ("does not support
    using Parameter") or calling a Python function its forward also calls (MaybeDropFuncGraphs: "The
    pointer[func_graph->get_return()] is null"): the ring kernel gets its rank flags as an argument and
    builds its backward from a twin module. Ring of one (this process), GQA heads: the island's
    gradients equal PyNative's."""
    import mindspore as ms
    from mindspore import Parameter, ParameterTuple, Tensor, nn
    from mindformers_core.distributed.process_group import world_group
    from mindformers_core.hsdp.units import Island
    from mindformers_core.sharding import context_parallel as C

    b, n, g, s, d = 1, 4, 2, 8, 4
    core = C.RingAttentionCore(world_group(), (b, n, s, d), (b, g, s, d), 0.5, True)
    assert not list(core.attend.get_parameters()) and len(list(core.get_parameters())) == 1
    assert type(core.attend.backward).__module__ != C.__name__      # the backward's Cells: the twin's

    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.core = core
            self.w = Parameter(Tensor(np.linspace(0.5, 1.5, d).astype(np.float32)), name="w")

        def construct(self, x):
            return self.core(x * self.w, x[:, :g], x[:, g:] * 3)[..., :d] * 2

    x = Tensor(np.random.RandomState(0).randn(b, n, s, d).astype(np.float32))
    out = {}
    for name, net in (("pynative", Net()), ("island", Island(Net()))):
        def loss(a, net=net):
            return (net(a) * net(a)).sum()
        value, (dx, (dw,)) = ms.value_and_grad(loss, 0, ParameterTuple(net.trainable_params()))(x)
        out[name] = (value.asnumpy(), dx.asnumpy(), dw.asnumpy())
    for got, want in zip(out["island"], out["pynative"]):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert np.abs(out["pynative"][1]).max() > 0
