"""Tied word embeddings (``tie_word_embeddings: true``: Qwen3 up to 4B, Qwen2.5 up to 3B, Llama-3.2) under msrun
equal one process: the Qwen2 fixture (saved by transformers with a tied head) fine-tuned from its folder through
run_mindformer.py, 2 steps, at tensor parallel 2 (PyNative and jit; jit with sequence parallelism too) and data
parallel 2 (PyNative). At tp the embedding table is vocab-split: the lookup runs the vocab-parallel kernel and the
tied output layer multiplies by the same local rows, giving vocab-split logits for the vocab-parallel
cross-entropy (no model code knows the rank). Losses and grad norms to a relative 1e-5 of one process in the
same mode, and the trained weights (the live export at the end, merged from the shards) to 1e-5 of the largest
magnitude of each tensor. (Tied embeddings under pipeline parallelism are refused by name before training:
tests/test_trainer.py.)

The runs go in turn (``run_many``) in the suite's batched 2-worker launch (tests/msrun_batch.py); the one-process
references run here."""
import functools
import os
import tempfile

import numpy as np
import pytest

import run_mindformer
from mindformers_core.models.hf.folder import open_folder
from tests.msrun_batch import computed_ahead, job
from tests.test_hf_msrun import argv, hf_yaml
from tests.test_trainer import records
from tests.test_trainer_msrun import assert_close

pytestmark = pytest.mark.msrun
FOLDER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "hf", "qwen2")
COMMON = ["--runner_config.max_steps", 2, "--lr_schedule.warmup_steps", 0, "--optimizer.eps", 1e-3,
          "--callbacks", "[{type: MFLossMonitor}]"]
TP2 = ["--use_parallel", "True", "--parallel_config.model_parallel", 2]
SP = ["--parallel_config.use_seq_parallel", "True"]
DP2 = ["--use_parallel", "True", "--parallel_config.data_parallel", 2, "--runner_config.batch_size", 2]
RUNS = {"tp2_pynative": (1, TP2), "tp2_jit": (0, TP2), "tp2_sp_jit": (0, TP2 + SP), "dp2_pynative": (1, DP2)}


def run_argv(config, out, name, flag, *extra):
    return argv(config, out[name], "--mode", flag, *COMMON, *extra, "--export_hf_dir", out[f"{name}_hf"])


@functools.lru_cache(maxsize=None)
def plan():
    """The runs' output folders (each with ``<name>_hf``, its export) and the 2-worker argvs (once per process)."""
    base = tempfile.mkdtemp(prefix="tied_msrun_")
    config = hf_yaml(base, FOLDER)
    names = ["p1_pynative", "p1_jit", *RUNS]
    out = {k: os.path.join(base, k) for name in names for k in (name, f"{name}_hf")}
    two = [run_argv(config, out, name, flag, *extra) for name, (flag, extra) in RUNS.items()]
    return config, out, two


TWO = job("tied_tp2_dp2", 2, "tests.test_hf_msrun:run_many", lambda: {"argvs": plan()[2]}, timeout=600,
          group=__name__)


@computed_ahead
def one_process():
    """The one-process runs (PyNative, jit) into plan()'s p1_* folders."""
    config, out, _ = plan()
    for mode, flag in (("pynative", 1), ("jit", 0)):
        assert run_mindformer.main(run_argv(config, out, f"p1_{mode}", flag)) == 0


@pytest.fixture(scope="module")
def runs():
    config, out, two = plan()
    one_process()
    assert TWO.results() == [[0] * len(two)] * 2
    return out


def test_the_fixture_is_tied():
    folder = open_folder(FOLDER)
    assert folder.config["tie_word_embeddings"] is True and "lm_head.weight" not in folder.tensors


@pytest.mark.parametrize("name", list(RUNS))
def test_tied_embeddings_on_two_workers_equal_one_process(runs, name):
    mode = name.rsplit("_", 1)[1]
    one, two = records(runs[f"p1_{mode}"]), records(runs[name])
    assert len(one) == 2 and all(np.isfinite(r["loss"]) for r in one) and one[1]["loss"] < one[0]["loss"]
    assert_close([r["loss"] for r in two], [r["loss"] for r in one])
    assert_close([r["grad_norm"] for r in two], [r["grad_norm"] for r in one])
    want, got = open_folder(runs[f"p1_{mode}_hf"]), open_folder(runs[f"{name}_hf"])
    assert sorted(got.tensors) == sorted(want.tensors) and "lm_head.weight" not in got.tensors
    with want.reader() as a, got.reader() as b:
        for tensor in want.tensors:
            expect = a(tensor)
            err = np.abs(b(tensor) - expect).max() / max(np.abs(expect).max(), 1e-12)
            assert err <= 1e-5, f"{name}: {tensor} differs by {err:.2e} of its largest magnitude"
    trained = open_folder(FOLDER)
    with trained.reader() as a, want.reader() as b:      # the runs trained the tied table
        assert not np.array_equal(a("model.embed_tokens.weight"), b("model.embed_tokens.weight"))
