"""The bidirectional DualPipe under msrun: pp2 (2 ranks, each holding one model stage of the down copy and the
other model stage's up copy) trained for 2 SGD steps equals the whole model trained in one process: the step's
loss (the sum of the losses rank 0 and rank 1 report: the up route's and the down route's) every step, and
every weight of both copies after the steps (relative 1e-5), in PyNative and ms.jit; and pp2 x dp2 (4 ranks)."""
import numpy as np
import pytest

from tests.msrun_batch import job

pytestmark = pytest.mark.msrun
STEPS = 2
PP2 = job("dualpipe_pp2", 2, "tests.bodies.dualpipe_body:run",
          {"modes": ["pynative", "jit"], "steps": STEPS}, timeout=300, group=__name__)
# on 4 ranks under jit only (both modes at pp2 above)
PP2_DP2 = job("dualpipe_pp2_dp2", 4, "tests.bodies.dualpipe_body:run_with_dp",
              {"modes": ["jit"], "steps": STEPS}, timeout=300, group=__name__)


@pytest.mark.parametrize("mode", ["pynative", "jit"])
def test_dualpipe_pp2_matches_one_process(mode):
    per_rank = [r[mode] for r in PP2.results()]
    assert [r["stages"] for r in per_rank] == [[0, 3], [1, 2]]
    # both ranks end a route: rank 0 the up copy's (second half of the batch), rank 1 the down copy's
    assert all(None not in r["losses"] for r in per_rank)
    total = np.sum([r["losses"] for r in per_rank], axis=0)
    np.testing.assert_allclose(total, per_rank[0]["ref_losses"], rtol=1e-5, err_msg=f"{mode} losses")
    seen = set()
    for r in per_rank:
        for (copy, layer, kind), value in r["params"].items():
            ref = r["ref_params"][(layer, kind)]
            err = np.abs(value - ref).max() / np.abs(ref).max()
            assert err <= 1e-5, f"{mode} {copy} copy, layer {layer}: relative error {err:.2e}"
            seen.add((copy, layer))
    assert seen == {(c, layer) for c in ("down", "up") for layer in range(4)}, sorted(seen)


@pytest.mark.parametrize("mode", ["jit"])
def test_dualpipe_pp2_dp2_matches_one_process(mode):
    """4 ranks: pipeline pairs [0, 2] and [1, 3] (each its own mirror pair), data-parallel pairs [0, 1], [2, 3];
    a 16-row batch, half per replica: per replica the two pipeline ranks' losses add up to the whole batch's
    loss, and every weight of both copies on every rank equals one process's after 2 steps."""
    per_rank = [r[mode] for r in PP2_DP2.results()]
    assert [r["pp"] for r in per_rank] == [[0, 2], [1, 3], [0, 2], [1, 3]]
    assert [r["dp"] for r in per_rank] == [[0, 1], [0, 1], [2, 3], [2, 3]]
    for a, b in ((0, 2), (1, 3)):
        total = np.add(per_rank[a]["losses"], per_rank[b]["losses"])
        np.testing.assert_allclose(total, per_rank[a]["ref_losses"], rtol=1e-5, err_msg=f"{mode} losses {a}+{b}")
    for rank, r in enumerate(per_rank):
        assert len(r["params"]) == 8
        for (copy, layer, kind), value in r["params"].items():
            ref = r["ref_params"][(layer, kind)]
            err = np.abs(value - ref).max() / np.abs(ref).max()
            assert err <= 1e-5, f"{mode} rank {rank} {copy} copy, layer {layer}: relative error {err:.2e}"
