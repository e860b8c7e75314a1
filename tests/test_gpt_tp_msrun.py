"""Tensor (and sequence) parallel GPT under msrun equals one process: losses of 3 momentum-SGD steps and
the final weights merged from every rank's shards (relative 1e-5), in PyNative and under ms.jit.
The layers only declare layouts (shard()); propagation derives the rest."""
import numpy as np
import pytest

from tests.msrun_batch import computed_ahead, job
from tests.bodies.gpt_tp_body import reference

pytestmark = pytest.mark.msrun
TOL = 1e-5
TP2 = job("gpt_tp2", 2, "tests.bodies.gpt_tp_body:run",
          {"configs": {"tp2": (1, 2, False), "tp2_sp": (1, 2, True)}}, timeout=600, group=__name__)
# on 4 ranks one mode each (tp in both modes is proven on 2 ranks above): tp4 PyNative, dp2 x tp2 jit
TP4 = job("gpt_tp4", 4, "tests.bodies.gpt_tp_body:run",
          {"configs": {"tp4": (1, 4, False)}, "modes": ["pynative"]}, timeout=600, group=__name__)
DP2_TP2 = job("gpt_dp2_tp2", 4, "tests.bodies.gpt_tp_body:run",
              {"configs": {"dp2_tp2": (2, 2, False)}, "modes": ["jit"]}, timeout=600, group=__name__)
# packed rows (loss_mask, position_ids, segment_ids as model inputs) at dp2 x tp2, in PyNative (packed rows under
# jit: the feature grid's packed cells, tests/test_grid_msrun.py)
PACKED = job("gpt_dp2_tp2_packed", 4, "tests.bodies.gpt_tp_body:run",
             {"configs": {"dp2_tp2_packed": (2, 2, False, True)}, "modes": ["pynative"]}, timeout=600, group=__name__)


@computed_ahead
def both_modes():
    return reference(("pynative", "jit"))


@computed_ahead
def packed_both_modes():
    return reference(("pynative", "jit"), packed=True)


@pytest.fixture(scope="module")
def single_process():
    return both_modes()


def _merge(results, key):
    merged = {}
    for per_rank in results:
        for name, (local, slices, shape) in per_rank[key]["shards"].items():
            full = merged.setdefault(name, np.full(shape, np.nan, np.float32))
            full[tuple(slice(a, b) for a, b in slices)] = local
    return merged


@pytest.fixture(scope="module")
def single_process_packed():
    return packed_both_modes()


def _check(results, ref, names, modes=None):
    """``modes``: name -> the modes that name ran in (default both)."""
    for name in names:
        for mode in (modes or {}).get(name, ("pynative", "jit")):
            key = f"{name}/{mode}"
            want = ref[mode]
            for rank, per_rank in enumerate(results):
                got = np.array(per_rank[key]["losses"])
                rel = np.abs(got - want["losses"]) / np.abs(want["losses"])
                assert rel.max() <= TOL, f"{key} rank {rank}: losses {got} vs {want['losses']}"
            merged = _merge(results, key)
            assert sorted(merged) == sorted(want["weights"])
            for pname, full in merged.items():
                assert not np.isnan(full).any(), f"{key}: {pname} not covered by the shards"
                expect = want["weights"][pname]
                err = np.abs(full - expect).max() / max(np.abs(expect).max(), 1e-12)
                assert err <= TOL, f"{key}: weight {pname} differs by {err:.2e}"


def test_tp2_and_tp2_sequence_parallel(single_process):
    _check(TP2.results(), single_process, TP2.kwargs["configs"])
    # the losses really decrease (the model trains)
    assert single_process["pynative"]["losses"][-1] < single_process["pynative"]["losses"][0]


def test_tp4_and_dp2_tp2(single_process):
    _check(TP4.results(), single_process, TP4.kwargs["configs"], {"tp4": ["pynative"]})
    _check(DP2_TP2.results(), single_process, DP2_TP2.kwargs["configs"], {"dp2_tp2": ["jit"]})


def test_dp2_tp2_with_packed_rows_positions_and_loss_mask(single_process, single_process_packed):
    """The batch's loss_mask / position_ids / segment_ids split over dp with the tokens: the masked mean over the
    whole batch (count reduced before the division), by-position rotary and the per-row document mask under
    tp give the one-process losses and weights (PyNative here; jit: the feature grid's packed cells)."""
    _check(PACKED.results(), single_process_packed, PACKED.kwargs["configs"], {"dp2_tp2_packed": ["pynative"]})
    assert abs(single_process_packed["pynative"]["losses"][0] - single_process["pynative"]["losses"][0]) > 1e-3
