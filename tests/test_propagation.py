"""Sharding propagation in one process: the MindSpore FFN worked example, declared vs derived
layouts, Megatron's f/g and sequence-parallel pairs derived from declarations, explain(), errors."""
import numpy as np
import pytest
from mindspore import Parameter, Tensor, nn, ops

from mindformers_core.sharding import Layout
from mindformers_core.sharding.annotations import global_shape_of
from mindformers_core.sharding.parallelizer import parallelize, plan_sharding
from mindformers_core.sharding.propagation import PlanError
from mindformers_core.sharding.trace import TraceError, trace
from tests.sharding_models import MODELS

MESH8 = Layout((2, 4), ("dp", "mp"))


class Dense(nn.Cell):
    def __init__(self, i, o, declare=None, bias=False):
        super().__init__()
        self.weight = Parameter(Tensor(np.random.RandomState(i).randn(i, o).astype(np.float32)), name="weight")
        self.bias = Parameter(Tensor(np.zeros(o, np.float32)), name="bias") if bias else None
        self.declare = declare

    def construct(self, x):
        y = ops.matmul(x, self.weight)
        return y + self.bias if self.bias is not None else y

    def shard(self, config):
        return self.declare


class FFN(nn.Cell):
    """MindSpore's sharding-propagation example: only dense1's matmul is configured ((2,1),(1,4))."""

    def __init__(self, bias2=False):
        super().__init__()
        self.dense1 = Dense(784, 64, (MESH8("dp", "None"), None, MESH8("None", "mp")), bias=True)
        self.relu = nn.ReLU()
        self.dense2 = Dense(64, 10, bias=bias2)

    def construct(self, x):
        x = x.reshape(x.shape[0], -1)
        return self.dense2(self.relu(self.dense1(x)))


def _ops(plan):
    return [(n.op, n.scope, plan.results[n.index]) for n in plan.graph.nodes if n.kind == "op"]


def test_ffn_worked_example():
    plan = plan_sharding(FFN(), None, ((256, 28, 28), "float32"), mesh=MESH8,
                         input_layouts=[MESH8("None", "None", "None")])
    found = {(op, scope): res for op, scope, res in _ops(plan)}
    mm1, relu, mm2 = found[("matmul", "dense1")], found[("relu", "relu")], found[("matmul", "dense2")]
    assert [l.describe() for l in mm1.inputs] == ["(dp, None)", "(None, mp)"]       # ((2,1),(1,4))
    assert relu.inputs[0].describe() == "(dp, mp)"                                  # ReLU gets [2, 4]
    assert [l.describe() for l in mm2.inputs] == ["(dp, mp)", "(mp, None)"]         # [[2,4],[4,1]]
    assert mm2.output.partial == {"mp": "sum"}
    assert plan.param_layouts["dense2.weight"].describe() == "(mp, None)"           # derived, not declared
    assert plan.param_layouts["dense1.bias"].describe() == "(mp)"
    # the model output's pending sum is reduced at the model boundary
    (out,) = plan.output_layouts
    assert not out.partial
    text = plan.explain()
    assert "dense1.weight: (None, mp) (declared)" in text and "dense2.weight: (mp, None) (derived)" in text
    assert "all_reduce(sum) over mp" in text


def test_bias_after_partial_is_refused_with_advice():
    with pytest.raises(PlanError, match="partial layout .*reduce the partial"):
        plan_sharding(FFN(bias2=True), None, ((8, 28, 28), "float32"), mesh=MESH8)


def test_megatron_pairs_are_derived():
    model, shape = MODELS["mlp"]()
    plan = plan_sharding(model, {"dp": 1, "tp": 2}, (shape, "float32"))
    by_where = {r.where: r for r in plan.redistributions}
    f = by_where["enter of <model> tensor 0"]  # identity forward, all-reduce backward (hoisted from fc1)
    assert not f.forward.steps and [s.kind for s in f.backward.steps] == ["all_reduce"]
    g = by_where["exit of model.fc2 tensor 0"]         # all-reduce forward, identity backward
    assert [s.kind for s in g.forward.steps] == ["all_reduce"] and not g.backward.steps
    assert plan.grad_axes["model.fc1.weight"] == ()


def test_sequence_parallel_is_derived_from_a_declared_norm():
    model, shape = MODELS["sp_mlp"]()
    plan = plan_sharding(model, {"dp": 2, "tp": 2}, (shape, "float32"))
    by_where = {r.where: r for r in plan.redistributions}
    gather = by_where["enter of model.mlp tensor 0"]     # hoisted from fc1's boundary
    assert [s.kind for s in gather.forward.steps] == ["all_gather"]
    assert [s.kind for s in gather.backward.steps] == ["reduce_scatter"]
    scatter = by_where["exit of model.mlp.fc2 tensor 0"]
    assert [s.kind for s in scatter.forward.steps] == ["reduce_scatter"]
    assert [s.kind for s in scatter.backward.steps] == ["all_gather"]
    assert plan.grad_axes["model.norm.weight"] == ("dp", "tp")     # sequence-sharded norm weight
    assert plan.grad_axes["model.mlp.fc1.weight"] == ("dp",)


def test_parallelize_single_rank_is_exact():
    import mindspore as ms
    for name in ("mlp", "block"):
        ref, shape = MODELS[name]()
        model, _ = MODELS[name]()
        x = np.random.RandomState(0).standard_normal(shape).astype(np.float32)
        parallelize(model, {"dp": 1, "tp": 1}, x, rank=0)
        assert [p.name for p in model.get_parameters()] == [p.name for p in ref.get_parameters()]
        assert float(model(Tensor(x))) == pytest.approx(float(ref(Tensor(x))), rel=1e-6)
        with pytest.raises(PlanError, match="already parallelized"):
            plan_sharding(model, {"dp": 1, "tp": 1}, x)


def test_parameters_hold_local_shards():
    model, shape = MODELS["mlp"]()
    full = model.model.fc1.weight.asnumpy().copy()
    plan = plan_sharding(model, {"dp": 1, "tp": 2}, (shape, "float32"))
    from mindformers_core.sharding.parallelizer import _shard_parameters
    _shard_parameters(model, plan, rank=1)
    w = model.model.fc1.weight
    assert tuple(w.shape) == (8, 16) and global_shape_of(w) == (8, 32)
    np.testing.assert_array_equal(w.asnumpy(), full[:, 16:])


def test_untraced_op_is_an_error_naming_it():
    class Odd(nn.Cell):
        def construct(self, x):
            return ops.cumsum(x, 0) * 2.0

    with pytest.raises(TraceError, match="origin the tracer does not know"):
        trace(Odd(), Tensor(np.ones((2, 2), np.float32)))


def test_declared_layout_must_fit_the_mesh():
    other = Layout((4, 2), ("a", "b"))

    class Bad(nn.Cell):
        def __init__(self):
            super().__init__()
            self.d = Dense(4, 4, (other("a", "None"), None, None))

        def construct(self, x):
            return self.d(x)

    with pytest.raises(PlanError, match="device matrix"):
        plan_sharding(Bad(), None, ((8, 4), "float32"), mesh=MESH8)


def test_conflict_inside_a_construct_names_the_op():
    class Conflict(nn.Cell):
        """Two operands split on different dims over the same axis, added in one construct."""

        def __init__(self):
            super().__init__()
            self.a = Dense(4, 8, (None, MESH8("dp", "mp"), None))
            self.b = Dense(4, 8, (None, MESH8("mp", "None"), None))

        def construct(self, x):
            return self.a(x) + self.b(x)

    with pytest.raises(PlanError, match="add in <model>"):
        plan_sharding(Conflict(), None, ((8, 4), "float32"), mesh=MESH8)


@pytest.mark.parametrize("dp, tp", [(2, 1), (2, 2)])
def test_a_tied_embedding_weight_passed_to_the_output_layer_is_summed_once(dp, tp):
    """The embedding table passed as an argument to the tied output layer: the lookup's gradient and the tied
    matmul's both arrive partial over dp, so the parameter's grad_axes take dp and the boundary does not reduce
    it first (else the planner refused: 'would mix partial and complete contributions'); at tp its vocab rows
    give vocab-split logits (no conversion of the table)."""
    from mindformers_core.transformer import GPTModel, TransformerConfig
    config = TransformerConfig(num_layers=1, hidden_size=16, ffn_hidden_size=32, num_attention_heads=2,
                               vocab_size=64, seq_length=8, tie_word_embeddings=True, data_parallel_size=dp,
                               tensor_model_parallel_size=tp)
    ids = ((4, 8), "int32")
    plan = plan_sharding(GPTModel(config), config, ids, ids)
    name = "embedding.word_embeddings.weight"
    assert plan.grad_axes[name] == ("dp",)
    assert tuple(plan.param_layouts[name].sharded_axes()) == (("tp",) if tp > 1 else ())
    assert not [r for r in plan.redistributions if r.where.startswith("enter of output_layer tensor 1")]
