"""Propagation parity under msrun: models parallelized only by ``shard()`` declarations (and a
model without any, parallelized by a plan of styles: "plain", "plain_sp") give the single-process
loss and gradients (relative 1e-5), in PyNative and under ms.jit."""
import pytest

from mindformers_core.testing import run_msrun

pytestmark = pytest.mark.msrun
TOL = 1e-5


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
    # "plain" / "plain_sp": nn.Dense layers without shard(), parallelized by a plan of styles
    # (ColWise/RowWise, and SequenceParallel with reduce-scatter outputs)
    models = ["mlp", "attention", "block", "sp_mlp", "block_sp", "plain", "plain_sp"]
    results = run_msrun("tests.bodies.sharding_body:run", 2, timeout=400,
                        kwargs={"models": models, "dp": 1, "tp": 2})
    _check(results, models)
    assert results[0]["sp_mlp"]["redistributions"] >= 3
    assert results[0]["plain_sp"]["redistributions"] > results[0]["plain"]["redistributions"]


def test_dp2_tp2_block_on_4_ranks():
    models = ["mlp", "block", "block_sp"]
    results = run_msrun("tests.bodies.sharding_body:run", 4, timeout=500,
                        kwargs={"models": models, "dp": 2, "tp": 2})
    _check(results, models)


def test_dp2_tp4_sequence_parallel_block_on_8_ranks():
    models = ["block_sp"]
    results = run_msrun("tests.bodies.sharding_body:run", 8, timeout=600,
                        kwargs={"models": models, "dp": 2, "tp": 4})
    _check(results, models)
