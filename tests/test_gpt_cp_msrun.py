"""Context-parallel GPT under msrun equals one process: losses of 2 momentum-SGD steps and the final
weights merged from every rank's shards (relative 1e-5), in PyNative and under ms.jit. The sequence is
split over the ``cp`` mesh axis end to end (inputs in storage order, true RoPE positions, loss = mean
over all tokens); attention runs the ring / Ulysses / hybrid kernel. 2 ranks: ring cp2 with (PyNative) and
without (jit) causal load balancing, narrow value heads (ring PyNative, Ulysses jit); the balanced ring and Ulysses
at cp2 in both modes are the feature grid's cells. 4 ranks: ring cp4 (PyNative), Ulysses cp4 and cp2 x tp2 (PyNative),
dp2 x cp2 (PyNative; jit in the trainer's dp2 x cp2 job) and hybrid (Ulysses 2 x ring 2) in both modes."""
import pytest

from tests.msrun_batch import computed_ahead, job
from tests.bodies.gpt_cp_body import reference
from tests.test_gpt_tp_msrun import _check

pytestmark = pytest.mark.msrun
CP2 = job("gpt_cp2", 2, "tests.bodies.gpt_cp_body:run",
          # the balanced ring and Ulysses at cp2 in both modes are the feature grid's cp2 cells (through the
          # trainer: tests/test_grid_msrun.py); here each variant once: balanced PyNative (its plan read below),
          # unbalanced jit, narrow value heads
          {"configs": {"ring_cp2": {"cp": 2, "modes": ["pynative"]},
                       "ring_cp2_unbalanced": {"cp": 2, "balance": False, "modes": ["jit"]},
                       # value heads narrower than query/key heads (multi-latent attention's shape)
                       "ring_cp2_narrow_v": {"cp": 2, "narrow_v": True, "modes": ["pynative"]},
                       "ulysses_cp2_narrow_v": {"cp": 2, "algo": "ulysses", "narrow_v": True, "modes": ["jit"]}}},
          timeout=600, group=__name__)
# on 4 ranks Ulysses and cp2 x tp2 run in one mode where the same code is proven in the other mode
# elsewhere (Ulysses under jit at cp2 above; the trainer runs cp2 x tp2 Ulysses under jit), so the 4-rank
# launch stays short; the ring of 4 (hops through two-rank pairs, not the two-rank swap of cp2) and the
# hybrid run in both; dp2 x cp2 (ring) runs PyNative here: under jit it is the trainer's
# dp2_cp2_ring_hsdp_level3 job (tests/test_trainer_msrun.py: the same kernel with hsdp level3 on top,
# losses = one process to 1e-5), so a plain dp2 x cp2 jit run here proved it twice
CP4 = job("gpt_cp4", 4, "tests.bodies.gpt_cp_body:run",
          {"configs": {"ring_cp4": {"cp": 4, "modes": ["pynative"]},
                       "ulysses_cp4": {"cp": 4, "algo": "ulysses", "modes": ["pynative"]},
                       "hybrid_u2_r2": {"cp": 4, "algo": "hybrid", "ulysses": 2},
                       "cp2_tp2": {"cp": 2, "tp": 2, "modes": ["pynative"]},
                       "dp2_cp2": {"dp": 2, "cp": 2, "modes": ["pynative"]}}},
          timeout=900, group=__name__)


def modes_of(configs):
    return {name: kw.get("modes", ("pynative", "jit")) for name, kw in configs.items()}


@computed_ahead
def both_modes():
    return reference(("pynative", "jit"))


@computed_ahead
def narrow_v_both_modes():
    return reference(("pynative", "jit"), narrow_v=True)


@pytest.fixture(scope="module")
def single_process():
    return both_modes()


def _configs(job, narrow_v):
    return {n: kw for n, kw in job.kwargs["configs"].items() if bool(kw.get("narrow_v")) == narrow_v}


def test_ring_and_ulysses_cp2_balancing_on_and_off(single_process):
    results = CP2.results()
    configs = _configs(CP2, False)
    _check(results, single_process, configs, modes_of(configs))      # each = one process in its mode
    plan = results[0]["ring_cp2/pynative"]["plan"]
    assert "context_parallel_attention" in plan


def test_ring_ulysses_hybrid_cp4_and_cp_with_tp_dp(single_process):
    _check(CP4.results(), single_process, CP4.kwargs["configs"], modes_of(CP4.kwargs["configs"]))


def test_ring_and_ulysses_cp2_with_value_heads_narrower_than_query_heads():
    ref = narrow_v_both_modes()
    narrow = _configs(CP2, True)
    _check(CP2.results(), ref, narrow, modes_of(narrow))
    weights = ref["pynative"]["weights"]
    assert weights["decoder.layers.0.self_attention.linear_v.weight"].shape == (64, 16)   # 4 groups x 4
    assert weights["decoder.layers.0.self_attention.linear_q.weight"].shape == (64, 64)   # 8 heads x 8
