"""Multi-token prediction under msrun equals one process: the tiny trainer YAML with ``mtp_depth: 2`` (MindFormers'
graph-mode key), 2 steps, at tensor parallel 2 (jit: the depths' eh_proj column-split, the shared embedding and
head vocab-split, the shifted-label cross-entropy over vocab shards) and data parallel 2 (PyNative: the masked
means' token counts over the global batch); losses and the logged ``mtp_loss`` to a relative 1e-5 of one process
in the same mode. Context parallel 2 (ring, load-balanced: the sequence in storage order, PyNative; Ulysses with
depth 1 and packed rows is the feature grid's DeepSeek-V3 cell): each depth's shift maps a slot to the slot of the token k later (``transformer/mtp.py``), and the logged
term counts the cp ranks' partial sums once. On 4 workers, pp2 x dp2 with hsdp level3 (PyNative): the
last stage's copy of the embedding, its gradient summed with the first stage's before hsdp's reduction and counted 0
in the norm. The bidirectional DualPipe at pp2 (both modes): each of the 2 ranks holds the first stage in one
direction and the last in the other, sharing one table Parameter between them. (More MTP under pipeline parallelism: tests/test_deepseek_pp_msrun.py and
tests/test_deepseek_yaml_msrun.py.)

The two runs go in turn (``run_many``) in the suite's batched 2-worker launch (tests/msrun_batch.py); the
one-process references run here."""
import functools
import os
import tempfile

import numpy as np
import pytest

import run_mindformer
from tests.msrun_batch import computed_ahead, job
from tests.test_hf_msrun import argv
from tests.test_trainer import build_assets, records
from tests.test_trainer_msrun import assert_close

pytestmark = pytest.mark.msrun
MTP = ["--model.model_config.mtp_depth", 2, "--model.model_config.mtp_loss_factor", 0.3,
       "--runner_config.max_steps", 2, "--lr_schedule.total_steps", 2, "--callbacks", "[{type: MFLossMonitor}]"]
TP2 = ["--use_parallel", "True", "--parallel_config.model_parallel", 2]
DP2 = ["--use_parallel", "True", "--parallel_config.data_parallel", 2, "--runner_config.batch_size", 2]
CP2 = ["--use_parallel", "True", "--parallel_config.context_parallel", 2]
PP2_DP2_HSDP = ["--use_parallel", "True", "--parallel_config.pipeline_stage", 2, "--parallel_config.data_parallel", 2,
                "--parallel_config.micro_batch_num", 2, "--runner_config.batch_size", 1,
                "--parallel.enable_parallel_optimizer", "True", "--hsdp.optimizer_level"]
DUALPIPE = ["--use_parallel", "True", "--parallel_config.pipeline_stage", 2, "--parallel_config.micro_batch_num", 4,
            "--runner_config.batch_size", 1, "--parallel.pipeline_config.pipeline_scheduler", "dualpipe"]
# MTP (depth 1) under cp2 Ulysses with packed rows is the feature grid's (tests/test_grid_msrun.py); depth 2 under
# the ring stays here (PyNative: every 2-worker jit compile of this model costs the suite ~15 s)
RUNS = [("tp2", "jit"), ("dp2", "pynative"), ("cp2", "pynative"),
        ("pp2_dualpipe", "pynative")]      # (its jit twin passed when added, 2026-11-28: dropped for the suite's time)
# level3 in PyNative: under jit its last stage's first step (one compiled island per unit, the MTP layer's too)
# outlasted the CPU all-reduce's wait of the other stage's ranks in the loaded suite (it passed alone, 2.5e-7)
FOUR_RUNS = [("pp2_dp2_hsdp3", "pynative")]


@functools.lru_cache(maxsize=None)
def plan():
    """The runs' output folders and the 2-worker argvs (made once per process)."""
    base = tempfile.mkdtemp(prefix="mtp_msrun_")
    config = build_assets(os.path.join(base, "assets"))["yaml"]
    out = {k: os.path.join(base, k) for k in ("p1_jit", "p1_pynative", *(f"{n}_{m}" for n, m in RUNS + FOUR_RUNS))}
    two = [argv(config, out["tp2_jit"], "--mode", 0, *MTP, *TP2),
           argv(config, out["dp2_pynative"], "--mode", 1, *MTP, *DP2),
           argv(config, out["cp2_pynative"], "--mode", 1, *MTP, *CP2),
           argv(config, out["pp2_dualpipe_pynative"], "--mode", 1, *MTP, *DUALPIPE)]
    four = [argv(config, out["pp2_dp2_hsdp3_pynative"], "--mode", 1, *MTP, *PP2_DP2_HSDP, "level3")]
    return config, out, two, four


TWO = job("mtp_tp2_dp2_cp2", 2, "tests.test_hf_msrun:run_many", lambda: {"argvs": plan()[2]}, timeout=600,
          group=__name__)
FOUR = job("mtp_pp2_dp2_hsdp", 4, "tests.test_hf_msrun:run_many", lambda: {"argvs": plan()[3]}, timeout=600,
           group=__name__)


@computed_ahead
def one_process():
    """The one-process runs (PyNative, jit) into plan()'s p1_* folders."""
    config, out, _, _ = plan()
    for mode, flag in (("pynative", 1), ("jit", 0)):
        assert run_mindformer.main(argv(config, out[f"p1_{mode}"], "--mode", flag, *MTP)) == 0


@pytest.fixture(scope="module")
def runs():
    config, out, two, four = plan()
    one_process()
    assert TWO.results() == [[0] * len(two)] * 2
    assert FOUR.results() == [[0] * len(four)] * 4
    return out


@pytest.mark.parametrize("name, mode", RUNS + FOUR_RUNS)
def test_mtp_on_two_workers_equals_one_process(runs, name, mode):
    one, two = records(runs[f"p1_{mode}"]), records(runs[f"{name}_{mode}"])
    assert len(one) == 2 and all(np.isfinite(r["loss"]) and r["mtp_loss"] > 0 for r in one)
    assert_close([r["loss"] for r in two], [r["loss"] for r in one])
    assert_close([r["mtp_loss"] for r in two], [r["mtp_loss"] for r in one])
