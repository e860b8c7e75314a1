"""Recompute and swap inside a 2-rank pipeline (msrun): a 4-layer GPT split into two GPTModel stages,
one 1F1B step; with each recompute/swap configuration applied to the stages, the loss and every
gradient equal the run without it, in PyNative and under ms.jit. One launch covers both modes."""
import numpy as np
import pytest

from tests.msrun_batch import job

pytestmark = pytest.mark.msrun

# kept small to stay near a minute (MindFormers YAML keys are covered in one process)
CONFIGS = {"pynative": ["none", "mixed", "stage", "swap"], "jit": ["none", "mixed"]}
EXPECTED_UNITS = {   # rank -> config -> units (stage 0 holds layers 0-1, stage 1 layers 2-3, local names)
    0: {"mixed": ["decoder.layers.0.self_attention.core_attention", "decoder.layers.0.mlp.act", "decoder.layers.1"],
        "stage": ["decoder"],
        "swap": ["swap:decoder.layers.0.self_attention.core_attention", "swap:decoder.layers.0.mlp.act",
                 "swap:decoder.layers.1.self_attention.core_attention", "swap:decoder.layers.1.mlp.act"]},
    1: {"mixed": ["decoder.layers.0", "decoder.layers.1.self_attention.core_attention", "decoder.layers.1.mlp.act"],
        "stage": ["decoder"]},
}


RECOMPUTE_PP2 = job("recompute_pp2", 2, "tests.bodies.recompute_body:run",
                    {"modes": list(CONFIGS), "configs": CONFIGS}, timeout=240, group=__name__)


@pytest.fixture(scope="module")
def results():
    return RECOMPUTE_PP2.results()


@pytest.mark.parametrize("mode", list(CONFIGS))
def test_pp2_recompute_and_swap_parity(results, mode):
    for rank, res in enumerate(results):
        base = res[(mode, "none")]
        assert (base["loss"] is None) == (rank == 0)
        for name in CONFIGS[mode][1:]:
            got = res[(mode, name)]
            assert got["units"], f"rank {rank} {mode} {name}: nothing applied"
            if name in EXPECTED_UNITS[rank]:
                assert got["units"] == EXPECTED_UNITS[rank][name], (rank, name, got["units"])
            # bit-exact here; 1e-6 is the bar
            if rank == 1:
                assert abs(got["loss"] - base["loss"]) <= 1e-6 * abs(base["loss"]), (mode, name)
            assert got["grads"].keys() == base["grads"].keys()
            for key, g in got["grads"].items():
                ref = base["grads"][key]
                err = np.abs(g - ref).max() / max(np.abs(ref).max(), 1e-12)
                assert err <= 1e-6, f"rank {rank} {mode} {name} {key}: relative error {err:.2e}"
