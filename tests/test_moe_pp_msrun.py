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
