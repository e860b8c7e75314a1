"""Parallel generation under msrun: the generation step parallelized at tp2 (attention heads, MLP and the
vocabulary split; each rank holds the KV-cache slice of its key/value heads) gives the one-process tokens
and logits (1e-5 of the largest) in PyNative and jit, and transformers' greedy ids, on the Qwen3-MoE fixture
(GQA, q/k norm, experts: every part the dense Qwen3 has, plus MoE; the dense fixture ran here too until the
suite had to fit its time budget)."""
import os

import numpy as np
import pytest

from tests.msrun_batch import job

pytestmark = pytest.mark.msrun
DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "hf")
NAMES = ("qwen3_moe",)

# one body in the suite's batched 2-worker launch (tests/msrun_batch.py)
TP2 = job("generation_tp2", 2, "tests.bodies.generation_tp_body:run", {"names": NAMES}, timeout=600, group=__name__)


@pytest.mark.parametrize("name", NAMES)
def test_tp2_generation_equals_one_process(name):
    results = [r[name] for r in TP2.results()]
    assert len(results) == 2
    ref = np.load(os.path.join(DATA, name, "reference.npz"))
    want_ids = [[int(t) for t in ref[f"generated_{i}"]] for i in range(3)]
    for mode in ("pynative", "jit"):
        for rank, res in enumerate(results):
            got, one = res[mode]["tp"], res[mode]["one"]
            assert one["ids"] == want_ids
            assert got["ids"] == want_ids, f"rank {rank} {mode}"
            b, g, length, d = one["cache"]
            assert got["cache"] == (b, g // 2, length, d)                  # this rank's key/value heads only
            assert got["linear_q"][0] * 2 == one["linear_q"][0] or got["linear_q"][1] * 2 == one["linear_q"][1]
            err = np.abs(got["logits"] - one["logits"]).max() / np.abs(one["logits"]).max()
            assert err <= 1e-5, f"rank {rank} {mode}: logits {err:.2e}"
