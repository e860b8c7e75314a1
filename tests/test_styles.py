"""parallelize(model, config, plan={pattern: style}) for models without shard(): pattern matching,
errors naming close names, and the declarations each style produces."""
import numpy as np
import pytest
from mindspore import nn

from mindformers_core.sharding.parallelizer import mesh_layout, plan_sharding
from mindformers_core.sharding.propagation import PlanError
from mindformers_core.sharding.styles import (ColWiseParallel, NoParallel, PrepareInput, RowWiseParallel,
                                               SequenceParallel, match_plan)
from tests.sharding_models import MODELS, PlainAttentionMLP, plain_plan


class Stack(nn.Cell):
    def __init__(self):
        super().__init__()
        self.layers = nn.CellList([PlainAttentionMLP() for _ in range(3)])

    def construct(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def test_wildcards_match_one_component_and_double_star_many():
    model = Stack()
    hits = match_plan(model, {"layers.*.q": ColWiseParallel()})
    assert sorted(hits) == ["layers.0.q", "layers.1.q", "layers.2.q"]
    assert sorted(match_plan(model, {"**.down": RowWiseParallel()})) == ["layers.0.down", "layers.1.down",
                                                                        "layers.2.down"]
    assert sorted(match_plan(model, {"re:layers\\.[01]\\.(k|v)": ColWiseParallel()})) == [
        "layers.0.k", "layers.0.v", "layers.1.k", "layers.1.v"]


def test_unmatched_pattern_lists_close_names():
    with pytest.raises(PlanError, match=r"'layers\.\*\.qq' matches no Cell.*layers\.0\.q"):
        match_plan(Stack(), {"layers.*.qq": ColWiseParallel()})


def test_cell_matched_twice_and_non_style_are_errors():
    with pytest.raises(PlanError, match="matched by two plan patterns"):
        match_plan(Stack(), {"layers.0.q": ColWiseParallel(), "layers.*.q": RowWiseParallel()})
    with pytest.raises(PlanError, match="is not a style"):
        match_plan(Stack(), {"layers.0.q": "colwise"})


def test_styles_declare_megatron_layouts_for_dense_weights():
    model, shape = MODELS["plain"]()
    plan = plan_sharding(model, {"dp": 1, "tp": 2}, (shape, "float32"),
                         plan={f"model.{k}": v for k, v in plain_plan().items()})
    layouts = {k: v.describe() for k, v in plan.param_layouts.items()}
    assert layouts["model.q.weight"] == "(tp, None)"        # nn.Dense weight is (out, in)
    assert layouts["model.o.weight"] == "(None, tp)"
    assert layouts["model.up.bias"] == "(tp)"
    assert layouts["model.norm.weight"] == "(None)"
    kinds = sorted(s.kind for r in plan.redistributions for s in r.forward.steps)
    assert kinds == ["all_reduce", "all_reduce"]            # one after attention, one after the MLP


def test_rowwise_with_bias_is_refused():
    model, shape = MODELS["plain"]()
    with pytest.raises(PlanError, match="RowWiseParallel on a linear with a bias"):
        plan_sharding(model, {"dp": 1, "tp": 2}, (shape, "float32"), plan={"model.up": RowWiseParallel()})


def test_noparallel_and_prepare_input():
    mesh = mesh_layout({"dp": 2, "tp": 2})
    dense = nn.Dense(4, 4)
    decl = NoParallel().declare(dense, "d", mesh)
    assert {k: v.describe() for k, v in decl.weights.items()} == {"weight": "(None, None)", "bias": "(None)"}
    decl = PrepareInput([mesh("dp", "None")]).declare(dense, "d", mesh)
    assert decl.inputs[0].describe() == "(dp, None)"
    decl = SequenceParallel().declare(dense, "d", mesh)
    assert decl.outputs[0].describe() == "(dp, tp, None)"


def test_dense_runs_with_its_local_shards_after_the_trace():
    """The trace runs nn.Dense's BiasAdd on the full bias; PyNative caches that shape by tensor id,
    and set_data(slice_shape=True) keeps the id. After sharding, BiasAdd must see the shard."""
    from mindspore import Tensor, ops
    from mindformers_core.sharding.parallelizer import _shard_parameters
    model, shape = MODELS["plain"]()
    up = model.model.up
    w, b = up.weight.asnumpy().copy(), up.bias.asnumpy().copy()
    plan = plan_sharding(model, {"dp": 1, "tp": 2}, np.zeros(shape, np.float32),
                         plan={f"model.{k}": v for k, v in plain_plan().items()})
    _shard_parameters(model, plan, rank=1)
    assert tuple(up.bias.shape) == (32,) and tuple(ops.zeros_like(up.bias).shape) == (32,)
    x = np.random.RandomState(3).standard_normal((2, 16)).astype(np.float32)
    np.testing.assert_allclose(up(Tensor(x)).asnumpy(), np.maximum(x @ w.T + b, 0)[:, 32:], rtol=1e-5, atol=1e-6)


class DenseTanh(nn.Cell):
    def __init__(self):
        super().__init__()
        self.up = nn.Dense(16, 32, has_bias=False)
        self.down = nn.Dense(32, 16, has_bias=False, activation="tanh")

    def construct(self, x):
        return self.down(self.up(x))


def test_dense_activation_never_runs_on_partial_sums():
    """nn.Dense(activation=...) applies it inside the atomic Cell: a row-split weight would give
    tanh(partial) summed afterwards. The style refuses it; a derived plan gathers the input."""
    sample = np.zeros((4, 8, 16), np.float32)
    with pytest.raises(PlanError, match="RowWiseParallel on an nn.Dense with activation"):
        plan_sharding(DenseTanh(), {"dp": 1, "tp": 2}, sample, plan={"up": ColWiseParallel(), "down": RowWiseParallel()})
    plan = plan_sharding(DenseTanh(), {"dp": 1, "tp": 2}, sample, plan={"up": ColWiseParallel()})
    assert plan.param_layouts["down.weight"].describe() == "(None, None)"
    assert [s.kind for r in plan.redistributions for s in r.forward.steps] == ["all_gather"]
    assert not any(l.partial for l in plan.layouts.values())
