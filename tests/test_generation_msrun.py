"""Parallel generation under msrun: the generation step parallelized at tp2 (attention heads, MLP and the
vocabulary split; each rank holds the KV-cache slice of its key/value heads) gives the one-process tokens
and logits (1e-5 of the largest) in PyNative and jit, on transformers' Qwen3 fixture (GQA, q/k norm) and
greedy ids equal to transformers' own."""
import os

import numpy as np
import pytest

from mindformers_core.testing import run_msrun
from tests.bodies.generation_tp_body import generate

pytestmark = pytest.mark.msrun
DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "hf")


@pytest.mark.parametrize("name", ["qwen3", "qwen3_moe"])
def test_tp2_generation_equals_one_process(name):
    results = run_msrun("tests.bodies.generation_tp_body:run", 2, {"name": name}, timeout=600)
    assert len(results) == 2
    ref = np.load(os.path.join(DATA, name, "reference.npz"))
    want_ids = [[int(t) for t in ref[f"generated_{i}"]] for i in range(3)]
    for mode in ("pynative", "jit"):
        one = generate(name, mode, 1)
        assert one["ids"] == want_ids
        for rank, res in enumerate(results):
            got = res[mode]
            assert got["ids"] == want_ids, f"rank {rank} {mode}"
            b, g, length, d = one["cache"]
            assert got["cache"] == (b, g // 2, length, d)                  # this rank's key/value heads only
            assert got["linear_q"][0] * 2 == one["linear_q"][0] or got["linear_q"][1] * 2 == one["linear_q"][1]
            err = np.abs(got["logits"] - one["logits"]).max() / np.abs(one["logits"]).max()
            assert err <= 1e-5, f"rank {rank} {mode}: logits {err:.2e}"
