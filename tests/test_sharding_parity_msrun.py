"""Propagation parity under msrun: models parallelized only by ``shard()`` declarations (and a
model without any, parallelized by a plan of styles: "plain", "plain_sp") give the single-process
loss and gradients (relative 1e-5), in PyNative and under ms.jit."""
import pytest

from tests.msrun_batch import job

pytestmark = pytest.mark.msrun
TOL = 1e-5
# "plain" / "plain_sp": nn.Dense layers without shard(), parallelized by a plan of styles
# (ColWise/RowWise, and SequenceParallel with reduce-scatter outputs)
TP2_MODELS = ["mlp", "attention", "block", "sp_mlp", "block_sp", "plain", "plain_sp"]
# the standalone MLP is not rerun on dp2 x tp2: the block holds the same MLP (same declarations) and
# proves it there (and on tp2 above, standalone, in both modes)
DP2_TP2_MODELS = ["block", "block_sp"]
DP2_TP4_MODELS = ["block_sp"]
TP2 = job("sharding_tp2", 2, "tests.bodies.sharding_body:run", {"models": TP2_MODELS, "dp": 1, "tp": 2},
          timeout=400, group=__name__)
DP2_TP2 = job("sharding_dp2_tp2", 4, "tests.bodies.sharding_body:run",
              {"models": DP2_TP2_MODELS, "dp": 2, "tp": 2}, timeout=500, group=__name__)
DP2_TP4 = job("sharding_dp2_tp4", 8, "tests.bodies.sharding_body:run",
              {"models": DP2_TP4_MODELS, "dp": 2, "tp": 4}, timeout=600, group=__name__)


def _check(results, models):
    for rank, per_model in enumerate(results):
        assert sorted(per_model) == sorted(models)
        for name, entry in per_model.items():
            for mode in ("pynative", "jit"):
                r = entry[mode]
                assert r["loss_rel"] <= TOL, f"rank {rank} {name} {mode}: loss {r['loss']} vs {r['ref_loss']}"
                bad = {k: v for k, v in r["grad_rel"].items() if v > TOL}
                assert not bad, f"rank {rank} {name} {mode}: gradients differ {bad}"


def test_tp2_mlp_attention_block_and_sp():
    results = TP2.results()
    _check(results, TP2_MODELS)
    assert results[0]["sp_mlp"]["redistributions"] >= 3
    assert results[0]["plain_sp"]["redistributions"] > results[0]["plain"]["redistributions"]


def test_dp2_tp2_block_on_4_ranks():
    _check(DP2_TP2.results(), DP2_TP2_MODELS)


def test_dp2_tp4_sequence_parallel_block_on_8_ranks():
    _check(DP2_TP4.results(), DP2_TP4_MODELS)
