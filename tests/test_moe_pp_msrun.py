"""Mixture of experts with pipeline parallelism under msrun equals one process: the logged loss (the last
stage's CE + aux loss plus the load-balancing loss of the stages before it, summed over the pipeline
ranks) of 2 momentum-SGD steps and the final weights merged from every rank (relative 1e-5), dropless
routing.

Where each claim is proven:
* pp2 x MoE, 1F1B and DualPipeV (4 stages in a V), PyNative and jit, runtime level: ``moe_pp2`` (2 ranks).
* pp2 x dp2 x ep2 (experts split over ep inside dp), runtime level: ``moe_pp2_ep2``, 1F1B under jit (its
  expert-parallel stages hold collectives, so they recompute their forward in the backward).
* DualPipeV x dp2 x ep2 in PyNative, hsdp x pp x MoE, and ep + hsdp through the YAML trainer
  (run_mindformer.py): the 4-rank trainer job below (the 4-rank runtime-level DualPipeV config was dropped
  for it: it duplicated this proof at 4-rank batch time). 1F1B through the trainer: tests/test_trainer_msrun.py
  (dense pp2) and tests/test_fault_tolerance_msrun.py; DualPipeV under jit: ``moe_pp2`` and
  tests/test_pipeline_dualpipe_runtime.py."""
import pytest

from tests.msrun_batch import computed_ahead, job
from tests.bodies.moe_pp_body import reference
from tests.test_gpt_tp_msrun import _check

pytestmark = pytest.mark.msrun
PP2 = job("moe_pp2", 2, "tests.bodies.moe_pp_body:run",
          {"configs": {"pp2_1f1b": {"pp": 2, "schedule": "1f1b", "m": 2},
                       "pp2_dualpipev": {"pp": 2, "schedule": "dualpipev", "m": 4}}},
          timeout=600, group=__name__)
# 1F1B in PyNative on 4 ranks (both schedules are proven in both modes on 2 ranks above, ep in both modes in
# tests/test_moe_msrun.py; a 4-rank jit compile is the suite's dearest; DualPipeV x ep2 by the trainer job below)
PP2_EP2 = job("moe_pp2_ep2", 4, "tests.bodies.moe_pp_body:run",
              {"configs": {"pp2_dp2_ep2_1f1b": {"pp": 2, "dp": 2, "ep": 2, "schedule": "1f1b", "m": 2,
                                                "modes": ["pynative"]}}},
              timeout=900, group=__name__)


@computed_ahead
def both_modes():
    return reference()


@pytest.fixture(scope="module")
def single_process():
    return both_modes()


def test_pp2_moe_1f1b_and_dualpipev(single_process):
    results = PP2.results()
    _check(results, single_process, list(PP2.kwargs["configs"]))
    # 1F1B: stage 0 (dense layer 0 + MoE layer 1) kept its aux loss; DualPipeV: rank 0 holds stages 0 (dense
    # only) and 3 (the head), rank 1 stages 1 and 2 (MoE, aux kept there)
    assert [r["pp2_1f1b/pynative"]["local_aux"] for r in results] == [[True], [False]]
    assert [r["pp2_dualpipev/pynative"]["local_aux"] for r in results] == [[False, False], [True, True]]


def test_pp2_dp2_ep2_moe_1f1b(single_process):
    _check(PP2_EP2.results(), single_process, list(PP2_EP2.kwargs["configs"]), {"pp2_dp2_ep2_1f1b": ["pynative"]})


# the YAML trainer (run_mindformer.py): the tiny Llama made MoE by overrides (both layers MoE; expert bias moved
# after every step; clipping every step), DualPipeV over pp2 (4 stages in a V; layers_per_stage [1, 0, 1, 0]:
# rank 0 holds stage 0 (embedding + MoE layer 0) and stage 3 (the head), rank 1 stage 1 (empty) and stage 2 (MoE
# layer 1), so each pipeline rank makes a load-balancing loss of its own and rank 0 also the CE loss) x dp2 with
# the experts over ep2, the optimizer sharded by hsdp level2 (each stage over its own dp group, the experts over
# their expert-data-parallel domain)
def _moe_keys():
    from tests.test_moe_msrun import MOE_KEYS
    keys = list(MOE_KEYS)
    keys[keys.index("--model.model_config.first_k_dense_replace") + 1] = 0
    return keys


MICRO = 4
# AdamW weights after 3 steps: its g / sqrt(v) turns the rounding of near-zero gradient entries (summed in
# another order over micro-batches and ranks) into whole lr-sized steps; measured max 2.5e-5 (layer 0's
# linear_v), the tolerance test_moe_hsdp_msrun.py and test_hsdp_tp_msrun.py hold AdamW weights to
WEIGHT_RTOL = 1e-4
DUALPIPEV_EP2_HSDP_ARGS = [
    "--use_parallel", "True", "--parallel_config.pipeline_stage", 2, "--parallel_config.micro_batch_num", MICRO,
    "--parallel.pipeline_config.pipeline_scheduler", "dualpipev", "--parallel.pipeline_config.pipeline_interleave", 2,
    "--parallel.pipeline_config.layers_per_stage", "[1,0,1,0]",
    "--parallel_config.data_parallel", 2, "--parallel_config.expert_parallel", 2,
    "--parallel.enable_parallel_optimizer", "True", "--hsdp.optimizer_level", "level2",
    "--runner_config.batch_size", 1]     # rows per micro-batch and data-parallel rank: 8 rows a step


def _trainer_kwargs():
    import tempfile
    from tests.test_moe_msrun import ASSETS
    from tests.test_trainer import build_assets
    tiny = build_assets(ASSETS)
    return {"yaml": tiny["yaml"], "out_root": tempfile.mkdtemp(prefix="mfc_moe_dualpipev_"),
            "argv": _moe_keys() + DUALPIPEV_EP2_HSDP_ARGS, "modes": [1]}


TRAINER_DUALPIPEV = job("moe_trainer_dualpipev_ep2_hsdp", 4, "tests.bodies.moe_body:run_trainer", _trainer_kwargs,
                        timeout=600, group=__name__)


def test_trainer_dualpipev_dp2_ep2_hsdp_matches_one_process():
    """run_mindformer.py, DualPipeV pp2 x dp2 x ep2 with hsdp level2 (4 micro-batches) on 4 workers = one process
    on the whole batch (PyNative): the logged loss (CE + both layers' load-balancing loss, made on both pipeline
    ranks), the logged aux loss, the global gradient norm (clipped every step: each expert counted once over ep
    and hsdp's shards), the expert load of every step, and the step-3 weights and expert bias merged from the
    checkpoints every rank wrote."""
    import os
    import tempfile
    import numpy as np
    from mindformers_core.checkpoint import checkpoint_specs, load_checkpoint
    from tests.bodies.moe_body import run_trainer
    from tests.test_moe_msrun import MAX_GRAD_NORM
    got = TRAINER_DUALPIPEV.results()[0][1]
    one = tempfile.mkdtemp(prefix="mfc_moe_pp_one_")
    want = run_trainer(TRAINER_DUALPIPEV.used_kwargs["yaml"], one,
                       _moe_keys() + ["--runner_config.batch_size", 2 * MICRO], modes=(1,))[1]
    assert len(got) == len(want) == 3
    for key in ("loss", "aux_loss", "grad_norm"):
        a, b = np.array([r[key] for r in got]), np.array([r[key] for r in want])
        assert np.abs(a - b).max() <= 1e-5 * np.abs(b).max(), (key, a, b)
    assert min(r["grad_norm"] for r in want) > MAX_GRAD_NORM, "clipping not exercised"
    # tokens per expert per micro-batch: the pipeline's micro-batch is 1/MICRO of the one process's batch
    np.testing.assert_allclose(np.array([r["expert_load"] for r in got]) * MICRO, [r["expert_load"] for r in want],
                               atol=1e-3)
    assert want[-1]["loss"] < want[0]["loss"]
    merged = []
    for root in (TRAINER_DUALPIPEV.used_kwargs["out_root"], one):
        directory = os.path.join(root, "mode1", "checkpoint")
        merged.append(load_checkpoint(directory, checkpoint_specs(directory, 3), step=3, strict=False))
    assert sorted(merged[0]) == sorted(merged[1]) and any(k.endswith("router.expert_bias") for k in merged[1])
    worst = {k: float(np.abs(merged[0][k] - merged[1][k]).max() / max(np.abs(merged[1][k]).max(), 1e-12))
             for k in merged[1]}
    assert max(worst.values()) <= WEIGHT_RTOL, sorted(worst.items(), key=lambda kv: -kv[1])[:5]
