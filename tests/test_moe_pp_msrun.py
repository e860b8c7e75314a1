"""Mixture of experts with pipeline parallelism under msrun equals one process: the logged loss (the last
stage's CE + aux loss plus the load-balancing loss of the stages before it, summed over the pipeline
ranks) of 2 momentum-SGD steps and the final weights merged from every rank (relative 1e-5), dropless
routing. 2 ranks: pp2 with 1F1B and with DualPipeV (4 stages in a V), PyNative and jit; 4 ranks:
pp2 x dp2 with the experts split over ep2 inside dp, 1F1B (jit) and DualPipeV (PyNative)."""
import pytest

from tests.msrun_batch import job
from tests.bodies.moe_pp_body import reference
from tests.test_gpt_tp_msrun import _check

pytestmark = pytest.mark.msrun
PP2 = job("moe_pp2", 2, "tests.bodies.moe_pp_body:run",
          {"configs": {"pp2_1f1b": {"pp": 2, "schedule": "1f1b", "m": 2},
                       "pp2_dualpipev": {"pp": 2, "schedule": "dualpipev", "m": 4}}},
          timeout=600, group=__name__)
# one mode each on 4 ranks (both schedules are proven in both modes on 2 ranks above): 1F1B under jit (its
# expert-parallel stages hold collectives, so they recompute their forward in the backward), DualPipeV PyNative
PP2_EP2 = job("moe_pp2_ep2", 4, "tests.bodies.moe_pp_body:run",
              {"configs": {"pp2_dp2_ep2_1f1b": {"pp": 2, "dp": 2, "ep": 2, "schedule": "1f1b", "m": 2,
                                                "modes": ["jit"]},
                           "pp2_dp2_ep2_dualpipev": {"pp": 2, "dp": 2, "ep": 2, "schedule": "dualpipev", "m": 4,
                                                     "modes": ["pynative"]}}},
              timeout=900, group=__name__)


@pytest.fixture(scope="module")
def single_process():
    return reference()


def test_pp2_moe_1f1b_and_dualpipev(single_process):
    results = PP2.results()
    _check(results, single_process, list(PP2.kwargs["configs"]))
    # 1F1B: stage 0 (dense layer 0 + MoE layer 1) kept its aux loss; DualPipeV: rank 0 holds stages 0 (dense
    # only) and 3 (the head), rank 1 stages 1 and 2 (MoE, aux kept there)
    assert [r["pp2_1f1b/pynative"]["local_aux"] for r in results] == [[True], [False]]
    assert [r["pp2_dualpipev/pynative"]["local_aux"] for r in results] == [[False, False], [True, True]]


def test_pp2_dp2_ep2_moe_1f1b_and_dualpipev(single_process):
    _check(PP2_EP2.results(), single_process, list(PP2_EP2.kwargs["configs"]),
           {"pp2_dp2_ep2_1f1b": ["jit"], "pp2_dp2_ep2_dualpipev": ["pynative"]})


# the YAML trainer (run_mindformer.py): the tiny Llama made MoE by overrides (both layers MoE, so the first stage
# keeps a load-balancing loss of its own; expert bias moved after every step), pp2 x dp2 with ep2, 1F1B, PyNative
def _moe_keys():
    from tests.test_moe_msrun import MOE_KEYS
    keys = list(MOE_KEYS)
    keys[keys.index("--model.model_config.first_k_dense_replace") + 1] = 0
    return keys


PP2_EP2_ARGS = ["--use_parallel", "True", "--parallel_config.pipeline_stage", 2, "--parallel_config.micro_batch_num",
                2, "--parallel_config.data_parallel", 2, "--parallel_config.expert_parallel", 2,
                "--runner_config.batch_size", 1]     # rows per micro-batch and data-parallel rank: 4 rows a step


def _trainer_kwargs():
    import tempfile
    from tests.test_moe_msrun import ASSETS
    from tests.test_trainer import build_assets
    tiny = build_assets(ASSETS)
    return {"yaml": tiny["yaml"], "out_root": tempfile.mkdtemp(prefix="mfc_moe_pp2_ep2_"),
            "argv": _moe_keys() + PP2_EP2_ARGS, "modes": [1]}


TRAINER_PP2_EP2 = job("moe_trainer_pp2_ep2", 4, "tests.bodies.moe_body:run_trainer", _trainer_kwargs, timeout=600,
                      group=__name__)


def test_trainer_pp2_ep2_matches_one_process():
    """run_mindformer.py, pp2 x dp2 x ep2 (1F1B, 2 microbatches) on 4 workers = one process: the logged loss (CE +
    both layers' load-balancing loss, one of them made on the first stage), the logged aux loss and the expert load
    of every step, with the expert bias moved after every step from the counts of both stages."""
    import tempfile
    import numpy as np
    from tests.bodies.moe_body import run_trainer
    got = TRAINER_PP2_EP2.results()[0][1]
    want = run_trainer(TRAINER_PP2_EP2.used_kwargs["yaml"], tempfile.mkdtemp(prefix="mfc_moe_pp_one_"),
                       _moe_keys() + ["--runner_config.batch_size", 4], modes=(1,))[1]
    assert len(got) == len(want) == 3
    for key in ("loss", "aux_loss"):
        a, b = np.array([r[key] for r in got]), np.array([r[key] for r in want])
        assert np.abs(a - b).max() <= 1e-5 * np.abs(b).max(), (key, a, b)
    # tokens per expert per micro-batch: the pipeline's micro-batch is half of the one process's batch
    np.testing.assert_allclose(np.array([r["expert_load"] for r in got]) * 2, [r["expert_load"] for r in want],
                               atol=1e-3)
    assert want[-1]["loss"] < want[0]["loss"]
