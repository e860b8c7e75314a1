"""``pipeline_scheduler: dualpipe`` in the trainer without processes: the topology (stage indices, copies,
the ranks holding the embedding and the head), the schedule preflight builds, and the named refusals of what
DualPipe does not run with (before any process group). The msrun parity is tests/test_trainer_dualpipe_msrun.py."""
import pytest

from mindformers_core.pipeline import ScheduleDualPipe
from mindformers_core.pipeline.dualpipe import dualpipe_placement
from mindformers_core.training.config import ConfigError
from mindformers_core.training.topology import Topology
from tests.test_trainer import args, build_assets, config_of

DUALPIPE = ["--use_parallel", "True", "--parallel_config.pipeline_stage", 2, "--parallel_config.micro_batch_num", 4,
            "--parallel.pipeline_config.pipeline_scheduler", "dualpipe"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build_assets(str(tmp_path_factory.getbasetemp() / "dualpipe_assets"))


@pytest.mark.parametrize("p", [2, 4])
def test_topology_holds_model_stage_r_and_a_copy_of_p_minus_1_minus_r(p):
    for r in range(p):
        t = Topology(r, p, 1, 1, 1, "dualpipe")
        assert t.dualpipe and t.stage_num == 2 * p and t.model_stage_num == p
        assert t.placement == dualpipe_placement(p) and t.model_placement == tuple(range(p))
        assert t.stages == [r, 2 * p - 1 - r]
        assert [t.model_stage(s) for s in t.stages] == [r, p - 1 - r]
        assert [t.is_copy(s) for s in t.stages] == [False, True]
        # the embedding (model stage 0) and the head (model stage p-1) on the route ends: ranks 0 and p-1
        assert t.holds_first_stage == t.holds_last_stage == (r in (0, p - 1))
    one_f_one_b = Topology(1, 2, 1, 1, 1, "1f1b")
    assert not one_f_one_b.dualpipe and one_f_one_b.stages == [1] and not one_f_one_b.is_copy(1)


def test_yaml_runs_dualpipe(tiny, tmp_path):
    """Accepted; preflight builds this rank's ScheduleDualPipe from stage placeholders."""
    from mindformers_core.pipeline.stage import StageInfo
    from mindformers_core.pipeline.schedules import build_schedule
    cfg = config_of(args(tiny, tmp_path / "out", *DUALPIPE), worker_num=2)
    assert cfg.parallel.pipeline_config.pipeline_scheduler == "dualpipe"
    t = Topology(1, 2, 1, 1, 1, "dualpipe")
    sched = build_schedule("dualpipe", [StageInfo(s, t.stage_num) for s in t.stages], 4)
    assert isinstance(sched, ScheduleDualPipe) and sched.copies == [(0, 2), (1, 3)]


@pytest.mark.parametrize("extra, workers, expected", [
    (["--parallel_config.micro_batch_num", 3], 2,
     "parallel_config.micro_batch_num = 3: must be even and >= 2 x pipeline_stage = 4 with "
     "parallel.pipeline_config.pipeline_scheduler = 'dualpipe'"),
    (["--parallel_config.micro_batch_num", 2], 2, "parallel_config.micro_batch_num = 2: must be even and >= 2 x"),
    (["--parallel_config.pipeline_stage", 3, "--parallel_config.micro_batch_num", 6,
      "--model.model_config.num_layers", 3], 3, "parallel_config.pipeline_stage = 3: must be even with "
                                               "parallel.pipeline_config.pipeline_scheduler = 'dualpipe'"),
    (["--parallel.pipeline_config.pipeline_interleave", 2], 2,
     "parallel.pipeline_config.pipeline_interleave = 2: scheduler 'dualpipe' needs pipeline_interleave == 1"),
    (["--parallel.enable_parallel_optimizer", "True"], 2,
     "parallel.enable_parallel_optimizer = True: not with parallel.pipeline_config.pipeline_scheduler = "
     "'dualpipe': hsdp"),
    (["--model.model_config.num_experts", 4], 2,
     "model.model_config.num_experts = 4 (expert_parallel 1): a mixture of experts is not run with "
     "parallel.pipeline_config.pipeline_scheduler = 'dualpipe'"),
])
def test_yaml_refuses_what_dualpipe_does_not_run(tiny, tmp_path, extra, workers, expected):
    with pytest.raises(ConfigError) as e:
        config_of(args(tiny, tmp_path / "out", *DUALPIPE, *extra), worker_num=workers)
    assert expected in str(e.value)


def test_cli_draws_dualpipe_from_its_name(capsys):
    """``dualpipe`` is a built-in name for the visualizer too: the schedule is simulated with its routes."""
    from mindformers_core.pipeline.simulator import simulate
    from mindformers_core.pipeline.stage import stages_of_rank
    from mindformers_core.pipeline.visualize import run
    assert run(["--schedule", "dualpipe", "--stages", "2", "--microbatches", "4"]) == 0
    out = capsys.readouterr().out
    want = simulate(ScheduleDualPipe(stages_of_rank(0, 2, 2, "v"), 4))
    assert "ScheduleDualPipe: 4 stage(s) on 2 rank(s), 4 microbatch(es)" in out
    assert f"makespan {want.makespan:g}, bubble {want.bubble_ratio:.1%}" in out
