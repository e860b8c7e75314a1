"""Expert-parallel MoE GPT under msrun equals one process: losses of 2 momentum-SGD steps and the
final weights (dense and expert) merged from every rank's shards (relative 1e-5), in PyNative and
under ms.jit, dropless routing. 2 ranks: ep2 (softmax top-2) and ep2 with sigmoid scores and
group-limited routing; 4 ranks: ep4, ep2 x dp2 (expert gradients summed over the expert-data-parallel
group only; the load-balancing loss over the whole global batch), ep2 x tp2 (dense layers tensor
parallel, experts replicated over tp)."""
import pytest

from tests.msrun_batch import job
from tests.bodies.moe_body import reference
from tests.test_gpt_tp_msrun import _check

pytestmark = pytest.mark.msrun
EP2 = job("moe_ep2", 2, "tests.bodies.moe_body:run",
          {"configs": {"ep2": {"dp": 2, "ep": 2}, "ep2_sigmoid_groups": {"dp": 2, "ep": 2, "group": True}}},
          timeout=600, group=__name__)
EP4 = job("moe_ep4", 4, "tests.bodies.moe_body:run",
          {"configs": {"ep4": {"dp": 4, "ep": 4}, "ep2_dp2_global_aux": {"dp": 4, "ep": 2, "balance": "aux_loss"},
                       "ep2_tp2": {"dp": 2, "ep": 2, "tp": 2}}}, timeout=900, group=__name__)


@pytest.fixture(scope="module")
def single_process():
    return reference()


def test_ep2_softmax_and_sigmoid_group_routing(single_process):
    results = EP2.results()
    _check(results, single_process, ["ep2"])
    _check(results, reference(group=True), ["ep2_sigmoid_groups"])
    plan = results[0]["ep2/pynative"]["plan"]
    assert "local kernel: expert_parallel" in plan
    assert "experts.w_gate: (ep, None, None) (declared), grad summed over nothing" in plan


def test_ep4_ep2xdp2_ep2xtp2(single_process):
    results = EP4.results()
    _check(results, single_process, ["ep4", "ep2_tp2"])
    _check(results, reference(balance="aux_loss"), ["ep2_dp2_global_aux"])   # the batch-wide loss, exactly
    plan = results[0]["ep2_dp2_global_aux/pynative"]["plan"]
    assert "experts.w_gate: (ep, None, None) (declared), grad summed over ['edp']" in plan
    assert "router.weight: (None, None) (derived), grad summed over ['edp', 'ep']" in plan
