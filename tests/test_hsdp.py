"""hsdp in one process: argument validation (before any group exists), rank groups, the
per-parameter plan, ZeRO formulas, bucket layouts, and training parity on a one-rank world."""
import numpy as np
import mindspore as ms
import pytest
from mindspore import Parameter, Tensor, nn, ops

from mindformers_core.hsdp import cell as hsdp_cell
from mindformers_core.hsdp import hsdp, plan_param, plan_table, shard_rank_lists, zero_bytes
from mindformers_core.hsdp.step import Comm, DataParallelGradReducer, Gather
from mindformers_core.optim import AdamW
from tests.bodies import hsdp_body as body


@pytest.mark.parametrize("kwargs, message", [
    ({"optimizer_level": "level4"},
     r"optimizer_level='level4' is not valid; valid values are 'level1', 'level2', 'level3'"),
    ({"optimizer_level": "zero2"}, "optimizer_level='zero2'"),
    ({"shard_size": 3}, r"shard_size=3 must divide the data-parallel size 4; valid values are -1 "
                        r"\(all 4 data-parallel ranks\) or one of \[1, 2, 4\]"),
    ({"shard_size": 0}, "shard_size=0 must divide"),
    ({"shard_size": 2.0}, "shard_size=2.0 must divide"),
    ({"threshold": -1}, "threshold=-1 must be a number of KB >= 0"),
    ({"accumulate_grad_step": 0}, "accumulate_grad_step=0 must be an integer >= 1"),
])
def test_bad_arguments_fail_before_any_group(monkeypatch, kwargs, message):
    def no_groups(ranks):
        raise AssertionError(f"a group {ranks} was created before validation")
    monkeypatch.setattr(hsdp_cell, "new_group", no_groups)
    with pytest.raises(ValueError, match=message):
        hsdp(nn.Dense(2, 2), dp_group=[0, 1, 2, 3], **kwargs)


def test_bad_cell_and_group_types():
    with pytest.raises(TypeError, match="cell must be a mindspore.nn.Cell"):
        hsdp(lambda x: x)
    with pytest.raises(TypeError, match="dp_group="):
        hsdp(nn.Dense(2, 2), dp_group="dp")
    with pytest.raises(ValueError, match=r"shard_size=2 must divide the data-parallel size 1"):
        hsdp(nn.Dense(2, 2), shard_size=2)   # the default group is the one-rank world here


def test_shard_and_replica_groups():
    ranks = list(range(8))
    assert shard_rank_lists(ranks, 2, 5) == ([4, 5], [1, 3, 5, 7])
    assert shard_rank_lists(ranks, 4, 5) == ([4, 5, 6, 7], [1, 5])
    assert shard_rank_lists(ranks, 8, 5) == (ranks, [5])
    assert shard_rank_lists(ranks, 1, 5) == ([5], ranks)
    # a data-parallel group with a stride (tp=2): shard inside consecutive dp ranks
    assert shard_rank_lists([1, 3, 5, 7], 2, 5) == ([5, 7], [1, 5])
    with pytest.raises(ValueError, match="rank 2 is not in the data-parallel group"):
        shard_rank_lists([1, 3, 5, 7], 2, 2)


def test_plan_param():
    p = plan_param("w", (64, 16), 4, 4, 1, shard_index=3)
    assert (p.sharded, p.dim, p.shard_shape, p.offset) == (True, 0, (16, 16), 48)
    p = plan_param("w2", (6, 64), 4, 4, 1, shard_index=1)       # dim 0 not divisible: dim 1
    assert (p.sharded, p.dim, p.shard_shape, p.offset) == (True, 1, (6, 16), 16)
    assert not plan_param("b", (64,), 4, 4, 1, 0).sharded        # 0.25 KB < 1 KB
    assert "threshold" in plan_param("b", (64,), 4, 4, 1, 0).reason
    assert plan_param("b", (64,), 4, 4, 0, 0).sharded            # threshold 0: everything
    assert not plan_param("odd", (5, 7), 4, 2, 0, 0).sharded
    assert "no dim" in plan_param("odd", (5, 7), 4, 2, 0, 0).reason
    assert not plan_param("w", (64, 16), 4, 1, 0, 0).sharded      # shard_size 1 = data parallel
    text = plan_table([plan_param("w", (64, 16), 4, 4, 1, 0), plan_param("b", (64,), 4, 4, 1, 0)], "level3", 4)
    assert "w" in text and "(16, 16)" in text and "sharded 4.0 KB of 4.2 KB" in text


def test_zero_formulas():
    plans = [plan_param("w", (256, 256), 4, 4, 64, 0), plan_param("b", (256,), 4, 4, 64, 0)]
    big, small = 256 * 256 * 4, 256 * 4
    assert zero_bytes(plans, "level1", 4) == {"params": big + small, "grads": big + small,
                                              "optimizer": 2 * (big / 4 + small)}
    assert zero_bytes(plans, "level2", 4)["grads"] == big / 4 + small
    assert zero_bytes(plans, "level3", 4) == {"params": big / 4 + small, "grads": big / 4 + small,
                                              "optimizer": 2 * (big / 4 + small)}
    assert zero_bytes(plans, "level3", 4, ignore_threshold=True)["params"] == (big + small) / 4


class _Rows(nn.Cell):
    """Fake shard-group collectives for rank 0 of 2 in one process: the reduce-scatter keeps row 0
    (only this rank contributes), the all-gather stacks this rank's row and ``2 * row + 1``."""

    def __init__(self, gather):
        super().__init__()
        self.gather = gather

    def construct(self, x):
        if self.gather:
            return ops.concat((x, 2 * x + 1), 0)
        return x[0:1]


def _fake_comm(shard_size=2):
    comm = Comm.__new__(Comm)
    comm.shard_size = shard_size
    comm.dp_sum = comm.replica_sum = _Id()
    comm.reduce_scatter, comm.all_gather = _Rows(False), _Rows(True)
    return comm


class _Id(nn.Cell):
    def construct(self, x):
        return x


@pytest.mark.parametrize("mode", ["pynative", "jit"])
def test_bucket_layout_for_dim0_and_dim1_shards(mode):
    plans = [plan_param("a", (4, 6), 4, 2, 0, 0), plan_param("b", (3, 8), 4, 2, 0, 0),
             plan_param("c", (5,), 4, 2, 1, 0)]
    assert [p.dim for p in plans] == [0, 1, None]
    rng = np.random.default_rng(0)
    grads = tuple(Tensor(rng.standard_normal(p.shape).astype(np.float32)) for p in plans)
    comm = _fake_comm()
    reducer = DataParallelGradReducer(plans, "level2", comm, 0.5)
    gather = Gather([plans[0], plans[1]], comm)
    run_r = ms.jit(_call2(reducer)) if mode == "jit" else reducer
    run_g = ms.jit(_call1(gather)) if mode == "jit" else gather
    out, loss = run_r(grads, Tensor(np.float32(3.0)))
    g = [x.asnumpy() for x in grads]
    np.testing.assert_allclose(out[0].asnumpy(), 0.5 * g[0][:2], rtol=1e-6)
    np.testing.assert_allclose(out[1].asnumpy(), 0.5 * g[1][:, :4], rtol=1e-6)
    np.testing.assert_allclose(out[2].asnumpy(), 0.5 * g[2], rtol=1e-6)
    assert float(loss.asnumpy()) == 1.5
    full = run_g((Tensor(g[0][:2]), Tensor(g[1][:, :4])))
    np.testing.assert_allclose(full[0].asnumpy(), np.concatenate([g[0][:2], 2 * g[0][:2] + 1], 0), rtol=1e-6)
    np.testing.assert_allclose(full[1].asnumpy(), np.concatenate([g[1][:, :4], 2 * g[1][:, :4] + 1], 1),
                               rtol=1e-6)


def _call1(cell):
    def fn(x):
        return cell(x)
    return fn


def _call2(cell):
    def fn(x, y):
        return cell(x, y)
    return fn


@pytest.mark.parametrize("mode", ["pynative", "jit"])
@pytest.mark.parametrize("level", ["level1", "level3"])
def test_one_rank_world_equals_plain_training(mode, level):
    result = body.train(level, 1, mode)
    ref_losses, ref_params = body.reference()
    np.testing.assert_allclose(result["losses"], ref_losses, rtol=1e-5)
    for name, ref in ref_params.items():
        np.testing.assert_allclose(result["params"][name], ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())
    assert result["counts"] == [[0]] * body.STEPS   # one rank: no collectives at all


def test_one_rank_accumulation_equals_full_batch():
    result = body.train("level2", 1, "pynative", accumulate=2, steps=body.SHORT)
    ref_losses, ref_params = body.reference(body.SHORT)
    np.testing.assert_allclose(result["losses"], ref_losses, rtol=1e-5)
    for name, ref in ref_params.items():
        np.testing.assert_allclose(result["params"][name], ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())


def test_manual_pair_equals_train_step():
    net = body.MLP()
    wrapped = hsdp(net, threshold=body.THRESHOLD_KB, optimizer_level="level1")
    opt = wrapped.shard_optimizer(body.optimizer(wrapped.trainable_params()))
    grad_fn = ms.value_and_grad(body.Loss(wrapped), None, opt.parameters)
    losses = []
    for s in range(body.STEPS):
        x, y = body.data(s)
        loss, grads = grad_fn(Tensor(x), Tensor(y))
        wrapped.apply_gradients(wrapped.reduce_gradients(grads), opt)
        losses.append(float(loss.asnumpy()))
    np.testing.assert_allclose(losses, body.reference()[0], rtol=1e-5)


def test_optimizer_checks():
    net = body.MLP()
    wrapped = hsdp(net)
    with pytest.raises(TypeError, match="must follow the mindformers_core.optim.Optimizer protocol"):
        wrapped.train_step(body.Loss(wrapped), nn.Adam(net.trainable_params()))
    stranger = Parameter(Tensor(np.zeros((2,), np.float32)), name="stranger")
    with pytest.raises(ValueError, match="updates 'stranger', which is not a trainable parameter"):
        wrapped.shard_optimizer(AdamW([stranger]))
    with pytest.raises(ValueError, match="mode='graph'; valid modes are 'pynative' and 'jit'"):
        wrapped.train_step(body.Loss(wrapped), AdamW(net.trainable_params()), mode="graph")
    assert "fc1.weight" in wrapped.describe()


# ---- hsdp over pipeline stages ---------------------------------------------------------------
def _fake_stage(index=0, num=2, dp=None, pp=(0, 1)):
    from types import SimpleNamespace
    cell = nn.Dense(2, 2)
    return SimpleNamespace(cell=cell, params=tuple(cell.trainable_params()), stage_index=index, stage_num=num,
                           dp_group=None if dp is None else SimpleNamespace(ranks=tuple(dp)),
                           pp_ranks=list(pp))


def test_stage_dp_ranks_checks():
    from mindformers_core.hsdp import check_stage_dp_ranks
    # pp2 x dp2 on 4 ranks: stage 0 on [0, 1], stage 1 on [2, 3]; rank 1's pipeline is [1, 3]
    assert check_stage_dp_ranks([0, 1], [1, 3], 1) == [0, 1]
    with pytest.raises(ValueError, match=r"rank 2 is not in the stage's data-parallel group \[0, 1\]"):
        check_stage_dp_ranks([0, 1], [0, 2], 2)
    with pytest.raises(ValueError, match=r"dp_group=\[1, 3\] holds ranks \[3\] of this rank's pipeline "
                                         r"\(pp_ranks=\[1, 3\]\), which run other stages"):
        check_stage_dp_ranks([1, 3], [1, 3], 1)


def test_stage_dp_ranks_resolution():
    from mindformers_core.hsdp import stage_dp_ranks
    kw = {"rank": 1, "world_size": 4}
    st = _fake_stage(dp=[0, 1], pp=[1, 3])
    assert stage_dp_ranks([st], **kw) == [0, 1]                       # the stage's dp_group
    assert stage_dp_ranks([st], dp_group=[1, 0], **kw) == [1, 0]      # an explicit one wins
    # interleaved: two stages on the rank, same replicas
    assert stage_dp_ranks([st, _fake_stage(1, 4, dp=[0, 1], pp=[1, 3])], **kw) == [0, 1]
    with pytest.raises(ValueError, match=r"stages disagree on their data-parallel group: stage 0's dp_group = "
                                         r"\[0, 1\]; stage 1's dp_group = None"):
        stage_dp_ranks([st, _fake_stage(1, 4, pp=[1, 3])], **kw)
    # no dp group anywhere: fine for a pipeline spanning the world, an error otherwise
    assert stage_dp_ranks([_fake_stage(pp=[0, 1, 2, 3])], **kw) == [1]
    with pytest.raises(ValueError, match=r"cannot tell the data-parallel group of stage\(s\) \[0\].*"
                                         r"pass dp_group"):
        stage_dp_ranks([_fake_stage(pp=[1, 3])], **kw)


@pytest.mark.parametrize("kwargs, error, message", [
    ({"optimizer_level": "level4"}, ValueError, r"optimizer_level='level4' is not valid; valid values are "
                                                r"'level1', 'level2', 'level3'"),
    ({"shard_size": 3}, ValueError, r"shard_size=3 must divide the data-parallel size 4; valid values are -1 "
                                    r"\(all 4 data-parallel ranks\) or one of \[1, 2, 4\]"),
    ({"accumulate_grad_step": 2}, ValueError, r"accumulate_grad_step=2 is not supported with pipeline stages "
                                              r"\(valid: 1\).*raise micro_batch_num"),
])
def test_stage_arguments_fail_before_any_group(monkeypatch, kwargs, error, message):
    def no_groups(ranks):
        raise AssertionError(f"a group {ranks} was created before validation")
    monkeypatch.setattr(hsdp_cell, "new_group", no_groups)
    # rank 0 of a 1-rank world, told that its stage is replicated over [0, 2, 4, 6]
    with pytest.raises(error, match=message):
        hsdp(_fake_stage(dp=[0, 2, 4, 6], pp=[0, 1]), **kwargs)


def test_stage_list_type_errors():
    with pytest.raises(TypeError, match=r"cell must be a mindspore.nn.Cell, a pipeline stage \(PipelineStage\) "
                                        r"or a list of this rank's stages, got list"):
        hsdp([_fake_stage(), "not a stage"])
    from mindformers_core.hsdp import hsdp_stages
    with pytest.raises(TypeError, match=r"expected a pipeline stage or a non-empty list.*got \['str'\]"):
        hsdp_stages([_fake_stage(), "not a stage"])
    with pytest.raises(ValueError, match=r"stages \[0, 0\] repeat a stage index"):
        hsdp_stages([_fake_stage(), _fake_stage()])


@pytest.mark.parametrize("level", ["level1", "level3"])
def test_one_rank_pipeline_stage_equals_full_batch(level):
    """hsdp(stage).train_step(schedule, ...) on a one-stage pipeline in one process: the schedule's
    microbatches, clipping and AdamW equal one full-batch step."""
    from mindformers_core.pipeline import Schedule1F1B, ScheduleGPipe
    from mindformers_core.pipeline.runtime import PipelineStage

    def loss_fn(out, y):
        return ((out - y) ** 2).mean()

    stage = PipelineStage(body.MLP(), 0, 1, loss_fn=loss_fn)
    wrapped = hsdp(stage, threshold=body.THRESHOLD_KB, optimizer_level=level)
    assert stage.dp_reduced_by is wrapped
    opt = body.optimizer(wrapped.trainable_params())
    with pytest.raises(ValueError, match=r"the schedule runs stages \[0\] but hsdp wraps stages \[0\]; build the "
                                         r"schedule from the same PipelineStage objects"):
        wrapped.train_step(Schedule1F1B(PipelineStage(body.MLP(), 0, 1, loss_fn=loss_fn), 2), opt)
    step = wrapped.train_step(ScheduleGPipe(stage, 4), opt, max_grad_norm=0.5)
    losses = []
    for s in range(body.SHORT):
        losses.append(float(step(*(Tensor(a) for a in body.data(s))).asnumpy()))
        assert step.grad_norm is not None
    ref_losses, ref_params = body.reference(body.SHORT, max_grad_norm=0.5)
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-5)
    for name, value in wrapped.gather_full_params().items():
        ref = ref_params[name]
        np.testing.assert_allclose(value, ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())
    with pytest.raises(TypeError, match="the schedule runs the stages"):
        wrapped(Tensor(body.data(0)[0]))


class _Lookup(nn.Cell):
    """Computes with its child's weight without calling the child (like parallelize's
    vocab-parallel lookup)."""
    mfc_replaces_inner = True

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def construct(self, ids):
        return ops.gather(self.inner.embedding_table, ids, 0)


class _Block(nn.Cell):
    def __init__(self):
        super().__init__()
        self.up = nn.Dense(8, 16)
        self.down = nn.Dense(16, 8)


class _Model(nn.Cell):
    def __init__(self):
        super().__init__()
        self.embed = _Lookup(nn.Embedding(32, 8))
        self.layers = nn.CellList([_Block(), _Block()])
        self.head = nn.Dense(8, 32)


def _unit_names(patterns, model=None):
    from mindformers_core.hsdp.units import select_units
    model = model or _Model()
    sharded = {id(p): p for p in model.get_parameters() if "bias" not in p.name}
    return [name for name, _ in select_units(model, sharded, patterns)]


def test_level3_units_default_to_the_owning_cells():
    # the lookup computes in its child's place: the hooks go on the lookup, which is called
    assert _unit_names(None) == ["embed", "layers.0.up", "layers.0.down", "layers.1.up", "layers.1.down",
                                 "head"]


def test_level3_unit_patterns_group_blocks():
    assert _unit_names(["layers.*"]) == ["layers.0", "layers.1", "embed", "head"]
    assert _unit_names(["layers.*", "layers.0.up"]) == ["layers.0", "layers.1", "embed", "head"]
    with pytest.raises(ValueError, match=r"units pattern 'decoder\.layers\.\*' matches no sub-Cell; names "
                                         r"look like \['embed', 'embed.inner'"):
        _unit_names(["decoder.layers.*"])


class _TiedHead(nn.Cell):
    mfc_parameter_arguments = True       # handed the embedding table (sharding.annotations)

    def construct(self, x, table):
        return ops.matmul(x, table.T)


class _TiedModel(nn.Cell):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(32, 8)
        self.layers = nn.CellList([_Block()])
        self.head = _TiedHead()


def test_level3_a_cell_handed_a_parameter_is_a_unit():
    """The tied output layer owns no weight but multiplies by the embedding table it is handed: it is a unit (its
    hooks gather the Parameters among its arguments), unless a pattern's unit holds it."""
    assert _unit_names(None, _TiedModel()) == ["embed", "layers.0.up", "layers.0.down", "head"]
    assert _unit_names(["layers.*"], _TiedModel()) == ["layers.0", "embed", "head"]


def test_level3_units_argument_checks(monkeypatch):
    monkeypatch.setattr(hsdp_cell, "new_group", lambda ranks: pytest.fail("group created"))
    with pytest.raises(ValueError, match=r"units=\['layers\.\*'\] only apply to optimizer_level='level3' "
                                         r"\(got 'level2'\)"):
        hsdp(_Model(), dp_group=[0, 1], optimizer_level="level2", units=["layers.*"])
    with pytest.raises(ValueError, match=r"units='layers\.\*' must be a list of Cell-name patterns"):
        hsdp(_Model(), dp_group=[0, 1], optimizer_level="level3", units="layers.*")


class _IdentityWrapper:
    """What UnitGathering needs from an HSDPCell, one process: every weight 'sharded', gathered
    by the identity (so outputs must equal the plain model's)."""

    def __init__(self, network):
        from types import SimpleNamespace
        self.network, self.shard_size, self.holds_full_params = network, 1, False
        self.params = [p for p in network.get_parameters() if "bias" not in p.name]
        self.plan = SimpleNamespace(numel=0)

    def sharded_params(self):
        return [(p, self.plan) for p in self.params]

    def plan_of(self, p):
        return self.plan

    def unit_gather(self, plans):
        return lambda params: tuple(ops.mul(p, 1) for p in params)


def test_level3_jit_islands_replace_units_inside_sequential_cells():
    """make_islands swaps each unit in its parent; nn.SequentialCell calls its own list of cells,
    so that list must see the island too (else the unit runs unhooked on its shard: found with
    bench/hsdp.py's MLP of Dense/GELU/Dense blocks)."""
    from mindformers_core.hsdp.units import Island, UnitGathering

    class Blocks(nn.Cell):
        def __init__(self):
            super().__init__()
            ms.set_seed(1)
            self.blocks = nn.CellList([nn.SequentialCell(nn.Dense(4, 8), nn.GELU(), nn.Dense(8, 4))
                                       for _ in range(2)])

        def construct(self, x):
            for block in self.blocks:
                x = x + block(x)
            return x
    net = Blocks()
    x = Tensor(np.arange(8, dtype=np.float32).reshape(2, 4) / 8)
    want = net(x).asnumpy()
    units = UnitGathering(_IdentityWrapper(net))
    assert [n for n, _ in units.units] == ["blocks.0.0", "blocks.0.2", "blocks.1.0", "blocks.1.2"]
    units.make_islands()
    assert all(isinstance(c, Island) for seq in net.blocks for c in (seq.cell_list[0], seq.cell_list[2]))
    got = net(x).asnumpy()
    assert units.gathers == 4       # every unit's forward pre-hook ran (one gather each)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    assert not units.saved_shards and units.held_bytes == 0
