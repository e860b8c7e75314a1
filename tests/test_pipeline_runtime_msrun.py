"""Pipeline runtime parity under msrun: an 8-layer MLP split into stages and trained for 2 SGD
steps with each built-in schedule equals the whole model trained in one process (losses and final
weights, relative 1e-5), in PyNative and ms.jit."""
import numpy as np
import pytest

from mindformers_core.testing import run_msrun
from tests.msrun_batch import job
from mindformers_core.testing.msrun import MsrunError

pytestmark = pytest.mark.msrun
ALL = ["gpipe", "1f1b", "interleaved", "zb_h1", "zbv"]
PP4_SCHEDULES = ["1f1b", "interleaved"]
# 2 steps (3 until the suite had to fit 20 minutes): step 2 runs on the weights step 1 updated from
# the gradients the schedule accumulated over its microbatches, the carry a third step proves again
STEPS = 2
PP2 = job("pipeline_pp2", 2, "tests.bodies.pipeline_body:run_all",
          {"schedules": ALL, "modes": ["pynative", "jit"], "steps": STEPS}, timeout=600, group=__name__)
# on 4 ranks one mode each (every schedule runs in both modes at pp2 above): pp4 under jit, pp2 x dp2 in PyNative
# (pp2 x dp2 under jit: the trainer's pipelines with hsdp, tests/test_tied_embeddings_msrun.py, test_mtp_msrun.py)
PP4_MODES, PP2_DP2_MODES = ["jit"], ["pynative"]
PP4 = job("pipeline_pp4", 4, "tests.bodies.pipeline_body:run_all",
          {"schedules": PP4_SCHEDULES, "modes": PP4_MODES, "steps": STEPS}, timeout=600, group=__name__)
PP2_DP2 = job("pipeline_pp2_dp2", 4, "tests.bodies.pipeline_body:run_with_dp",
              {"schedule": "1f1b", "modes": PP2_DP2_MODES, "steps": STEPS}, timeout=600, group=__name__)


def _check(results, schedules, modes, stage_num_of):
    for name in schedules:
        for mode in modes:
            per_rank = [r[(name, mode)] for r in results]
            held = sorted(s for r in per_rank for s in r["stages"])
            assert held == list(range(stage_num_of(name))), f"{name}: stages {held}"
            last = [r for r in per_rank if r["losses"][0] is not None]
            assert len(last) == 1, f"{name} {mode}: exactly one rank reports the loss"
            np.testing.assert_allclose(last[0]["losses"], last[0]["ref_losses"], rtol=1e-5,
                                       err_msg=f"{name} {mode} losses")
            layers = set()
            for r in per_rank:
                for key, value in r["params"].items():
                    ref = r["ref_params"][key]
                    err = np.abs(value - ref).max() / np.abs(ref).max()
                    assert err <= 1e-5, f"{name} {mode} layer {key}: relative error {err:.2e}"
                    layers.add(key[0])
            assert layers == set(range(8)), f"{name} {mode}: layers {sorted(layers)}"


def test_every_schedule_pp2():
    results = PP2.results()
    _check(results, ALL, ["pynative", "jit"], lambda n: 4 if n in ("interleaved", "zbv") else 2)


def test_pp4_1f1b_and_interleaved():
    _check(PP4.results(), PP4_SCHEDULES, PP4_MODES, lambda n: 8 if n == "interleaved" else 4)


def test_pp2_with_data_parallel_2():
    """4 ranks: pipeline pairs [0,2], [1,3]; data-parallel pairs [0,1], [2,3]; a 16-row batch."""
    results = PP2_DP2.results()
    for mode in PP2_DP2_MODES:
        per_rank = [r[mode] for r in results]
        assert [r["dp"] for r in per_rank] == [[0, 1], [0, 1], [2, 3], [2, 3]]
        assert [r["pp"] for r in per_rank] == [[0, 2], [1, 3], [0, 2], [1, 3]]
        last = [r for r in per_rank if r["stage"] == 1]
        assert len(last) == 2
        for r in last:
            np.testing.assert_allclose(r["losses"], r["ref_losses"], rtol=1e-5, err_msg=mode)
        for r in per_rank:
            for key, value in r["params"].items():
                ref = r["ref_params"][key]
                err = np.abs(value - ref).max() / np.abs(ref).max()
                assert err <= 1e-5, f"{mode} layer {key}: relative error {err:.2e}"


@pytest.mark.beside_batch      # its own launch; rank 0 never sends, so no load makes the timeout pass wrongly
def test_stalled_peer_is_reported_not_hung():
    """A peer that never sends: the waiting stage names itself, the microbatch and the peer rank
    within its timeout instead of hanging. Rank 0 never sends whatever the timeout, so a short one (2 s;
    8 until the suite had to fit 20 minutes) proves the same."""
    import time
    start = time.monotonic()
    with pytest.raises(MsrunError) as err:
        run_msrun("tests.bodies.pipeline_body:run_stalled", 2, timeout=240, kwargs={"timeout": 2.0})
    text = str(err.value)
    assert "pipeline timeout: stage 1 (rank 1) waiting for the activation of microbatch 0 from stage 0 (rank 0)" \
        in text, text[-2000:]
    assert time.monotonic() - start < 150
