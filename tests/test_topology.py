"""training.Topology on RankGenerator: the default order is the old pipeline-outermost formula, other
orders agree with the generator's coordinates and groups; bad orders fail with clear messages, in
Topology and at config load (parallel_config.rank_order). Pure logic: no process group."""
import copy
import itertools
from pathlib import Path

import pytest

from mindformers_core.distributed.rank_generator import RankGenerator
from mindformers_core.training import ConfigError, load_config, read_yaml, validate
from mindformers_core.training.topology import DEFAULT_RANK_ORDER, Topology

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "configs" / "llama_tiny.yaml"
SIZES = [(2, 2, 2), (4, 1, 2), (1, 4, 2), (2, 3, 1), (3, 1, 1), (1, 1, 1), (2, 2, 3)]   # (pp, dp, tp)


def all_ranks(pp, dp, tp, **kw):
    return [Topology(r, pp, dp, tp, **kw) for r in range(pp * dp * tp)]


@pytest.mark.parametrize("pp,dp,tp", SIZES)
def test_default_order_is_the_old_formula(pp, dp, tp):
    per_stage = dp * tp
    for t in all_ranks(pp, dp, tp):
        r = t.rank
        assert t.order == DEFAULT_RANK_ORDER == "tp-cp-ep-dp-pp"
        assert (t.pp_rank, t.dp_rank, t.tp_rank) == (r // per_stage, r % per_stage // tp, r % tp)
        assert r == t.pp_rank * dp * tp + t.dp_rank * tp + t.tp_rank
        first = t.pp_rank * per_stage
        assert t.stage_ranks == list(range(first, first + per_stage))
        assert t.pp_ranks == [r % per_stage + k * per_stage for k in range(pp)]
        assert t.tp_group_ranks == [first + t.dp_rank * tp + k for k in range(tp)]
        assert t.dp_group_ranks == [first + k * tp + t.tp_rank for k in range(dp)]
        assert (t.world_size, t.per_stage) == (pp * dp * tp, per_stage)


def test_positional_fields_keep_their_order():
    t = Topology(5, 2, 2, 2, 2, "interleaved")
    assert (t.rank, t.pp, t.dp, t.tp, t.vpp, t.scheduler, t.order) == (5, 2, 2, 2, 2, "interleaved",
                                                                       DEFAULT_RANK_ORDER)
    assert t.describe() == ("rank 5: pipeline rank 1 (stages [1, 3] of 4), data-parallel rank 0, "
                            "tensor-parallel rank 1")
    assert Topology(5, 2, 2, 2, 2, "interleaved", "tp-dp-pp") != t   # order takes part in equality


def group_of(gen, token, rank):
    return next(g for g in gen.get_ranks(token) if rank in g)


@pytest.mark.parametrize("order", ["dp-tp-pp", "tp-pp-dp", "pp-dp-tp", "tp-dp-pp", "cp-pp-ep-tp-dp"])
@pytest.mark.parametrize("pp,dp,tp", [(2, 2, 2), (4, 1, 2), (2, 3, 2)])
def test_orders_agree_with_the_rank_generator(order, pp, dp, tp):
    gen = RankGenerator(tp=tp, ep=1, dp=dp, pp=pp, cp=1, order=order)
    seen = set()
    for t in all_ranks(pp, dp, tp, order=order):
        c = gen.coordinate(t.rank)
        assert (t.pp_rank, t.dp_rank, t.tp_rank) == (c["pp"], c["dp"], c["tp"])
        seen.add((t.pp_rank, t.dp_rank, t.tp_rank))
        assert t.tp_group_ranks == group_of(gen, "tp", t.rank)
        assert t.dp_group_ranks == group_of(gen, "dp", t.rank)
        assert t.pp_ranks == group_of(gen, "pp", t.rank)
        # groups are ordered by coordinate: index i holds the rank whose coordinate is i
        assert [gen.coordinate(r)["tp"] for r in t.tp_group_ranks] == list(range(tp))
        assert [gen.coordinate(r)["dp"] for r in t.dp_group_ranks] == list(range(dp))
        assert [gen.coordinate(r)["pp"] for r in t.pp_ranks] == list(range(pp))
        assert t.tp_group_ranks[t.tp_rank] == t.dp_group_ranks[t.dp_rank] == t.pp_ranks[t.pp_rank] == t.rank
        # stage mesh: row-major (dp, tp), all of this pipeline rank's ranks and no other
        stage = t.stage_ranks
        assert sorted(stage) == sorted(group_of(gen, "tp-dp", t.rank))
        for d, k in itertools.product(range(dp), range(tp)):
            assert gen.coordinate(stage[d * tp + k]) == dict(c, dp=d, tp=k)
        assert stage[t.dp_rank * tp + t.tp_rank] == t.rank
    assert len(seen) == pp * dp * tp   # every coordinate exactly once


def test_non_default_order_moves_the_groups():
    # dp fastest: the data-parallel replicas are neighbours, a stage's mesh is not row-major in rank
    t = Topology(1, 2, 2, 2, order="dp-tp-pp")
    assert (t.pp_rank, t.dp_rank, t.tp_rank) == (0, 1, 0)
    assert t.dp_group_ranks == [0, 1] and t.tp_group_ranks == [1, 3] and t.pp_ranks == [1, 5]
    assert t.stage_ranks == [0, 2, 1, 3]
    # pp before dp: a pipeline's stages are neighbouring tp groups, stages are not consecutive ranks
    t = Topology(6, 2, 2, 2, order="tp-pp-dp")
    assert (t.pp_rank, t.dp_rank, t.tp_rank) == (1, 1, 0)
    assert t.pp_ranks == [4, 6] and t.dp_group_ranks == [2, 6] and t.tp_group_ranks == [6, 7]
    assert t.stage_ranks == [2, 3, 6, 7]


@pytest.mark.parametrize("order", [DEFAULT_RANK_ORDER, "dp-tp-pp", "tp-pp-dp"])
@pytest.mark.parametrize("vpp,scheduler", [(1, "1f1b"), (2, "interleaved"), (2, "zbv"), (1, "gpipe")])
def test_placement_and_stages_depend_only_on_the_pipeline_rank(order, vpp, scheduler):
    pp, dp, tp = 2, 2, 2
    kind = "v" if scheduler == "zbv" else "interleaved"
    for t in all_ranks(pp, dp, tp, vpp=vpp, scheduler=scheduler, order=order):
        assert t.placement_kind == kind and t.stage_num == pp * vpp
        ref = Topology(t.pp_rank * dp * tp, pp, dp, tp, vpp, scheduler)   # same pipeline rank, default order
        assert (t.placement, t.stages) == (ref.placement, ref.stages)
        assert t.holds_first_stage == (0 in t.stages) == ref.holds_first_stage
        assert t.holds_last_stage == (t.stage_num - 1 in t.stages) == ref.holds_last_stage
    first, last = Topology(0, pp, dp, tp, vpp, scheduler, order), Topology(7, pp, dp, tp, vpp, scheduler, order)
    if scheduler == "zbv":   # V: pipeline rank 0 holds stages 0 and 3
        assert first.stages == [0, 3] and first.holds_first_stage and first.holds_last_stage
        assert not last.holds_first_stage and not last.holds_last_stage
    elif vpp == 2:           # interleaved: rank 0 holds 0 and 2, rank 1 holds 1 and 3
        assert first.holds_first_stage and not first.holds_last_stage
        assert last.holds_last_stage and not last.holds_first_stage


def test_layer_ranges_unchanged():
    t = Topology(0, 2, 1, 1, 2, "zbv", "pp-tp-dp")
    assert t.layer_ranges(8, [1, 3, 3, 1]) == Topology(0, 2, 1, 1, 2, "zbv").layer_ranges(8, [1, 3, 3, 1])


@pytest.mark.parametrize("order,reason", [
    ("tp-xp-pp", "unknown token(s) ['xp']"),
    ("TP-DP-PP", "unknown token(s) ['TP', 'DP', 'PP']"),
    ("tp-dp-tp-pp", "repeats ['tp']"),
    ("tp--dp-pp", "no empty token"),
    ("", "no empty token"),
    ("tp-dp", "leaves out pp=2"),
])
def test_bad_order_names_order_value_and_valid_tokens(order, reason):
    with pytest.raises(ValueError) as info:
        Topology(0, 2, 2, 2, order=order)
    msg = str(info.value)
    assert msg.startswith(f"Topology: order={order!r}: ")
    assert reason in msg and "['tp', 'cp', 'ep', 'dp', 'pp']" in msg


def test_order_may_leave_out_dimensions_of_size_one():
    assert Topology(3, 1, 2, 2, order="dp-tp").pp_ranks == [3]
    assert Topology(3, 4, 1, 1, order="pp").pp_ranks == [0, 1, 2, 3]


def test_other_arguments_still_checked():
    with pytest.raises(ValueError, match=r"rank=8 must be in \[0, 8\)"):
        Topology(8, 2, 2, 2)
    with pytest.raises(ValueError, match="tp=0 must be a positive integer"):
        Topology(0, 2, 2, 0)
    with pytest.raises(ValueError, match="scheduler='nope'"):
        Topology(0, 2, 1, 1, scheduler="nope")


# ---- parallel_config.rank_order at config load ------------------------------------------------

def config_errors(**changes):
    raw = copy.deepcopy(read_yaml(TINY))
    raw.setdefault("parallel_config", {}).update(changes)
    with pytest.raises(ConfigError) as info:
        validate(raw)
    return info.value.errors


def test_rank_order_key_defaults_to_megatron_and_accepts_orders():
    assert load_config(TINY).parallel_config.rank_order == DEFAULT_RANK_ORDER
    cfg = load_config(TINY, ["--parallel_config.rank_order", "tp-dp-pp"])
    assert cfg.parallel_config.rank_order == "tp-dp-pp"
    cfg = load_config(TINY, ["--parallel_config.rank_order", "dp-tp-pp", "--use_parallel", "True",
                             "--parallel_config.data_parallel", "2", "--parallel_config.model_parallel", "2"],
                      worker_num=4)
    assert cfg.parallel_config.rank_order == "dp-tp-pp"


@pytest.mark.parametrize("order,reason", [
    ("tp-xp-pp", "unknown token(s) ['xp']; valid tokens are ['tp', 'cp', 'ep', 'dp', 'pp']"),
    ("dp-tp-dp-pp", "repeats ['dp']"),
    ("tp-pp", "leaves out dp=2"),
])
def test_config_rule_rejects_bad_rank_order(order, reason):
    errors = config_errors(rank_order=order, data_parallel=2)   # dp 2 on one worker: also a size error
    mine = [e for e in errors if e.startswith("parallel_config.rank_order")]
    assert len(mine) == 1
    assert mine[0].startswith(f"parallel_config.rank_order = {order!r}: ") and reason in mine[0]


def test_config_rank_order_type_error_is_one_line():
    errors = config_errors(rank_order=3)
    assert len(errors) == 1 and errors[0].startswith("parallel_config.rank_order = 3")
