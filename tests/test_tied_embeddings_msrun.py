"""Tied word embeddings (``tie_word_embeddings: true``: Qwen3 up to 4B, Qwen2.5 up to 3B, Llama-3.2) under msrun equal
one process: the Qwen2 fixture (saved by transformers with a tied head) fine-tuned from its folder through
run_mindformer.py, 2 steps, at tensor parallel 2 (PyNative; jit with sequence parallelism) and data
parallel 2 (PyNative; and with hsdp level3 in PyNative, under jit with pp2 x dp2 below: the tied output layer owns no weight, so hsdp makes it a
unit of its own that gathers the table it is handed, ``hsdp/units.py``). At tp the embedding table is vocab-split:
the lookup runs the vocab-parallel kernel and the tied output layer multiplies by the same local rows, giving
vocab-split logits for the vocab-parallel cross-entropy (no model code knows the rank). Losses and grad norms to a
relative 1e-5 of one process in the same mode, and the trained weights (the live export at the end, merged from the
shards) to 1e-5 of the largest magnitude of each tensor.

Under pipeline parallelism (pp2: 1F1B in PyNative and jit, DualPipeV under jit, the bidirectional DualPipe in both
modes; on 4 workers pp2 x tp2 1F1B in PyNative, and pp2 x dp2 with hsdp level2 in PyNative and level3 under jit) the
last stage's tied output layer multiplies by its own copy of the embedding table, built under the embedding's name
(loaded from the folder like the first stage's), whose gradient the pipeline runtime sums with the first stage's
(``pipeline/runtime.py`` ``_sum_tied``; a rank holding both ends shares one Parameter: DualPipeV's rank 0, and both
of DualPipe's ranks, whose up copies' gradients ``_sum_copies`` adds first): the same losses, grad norms and export,
and the checkpoint holds the table once with the one process's values; a pp2 checkpoint resumes on one process and a
one-process checkpoint resumes at pp2 (step 2's loss and AdamW moments = the uninterrupted run's). The sum comes
before the data-parallel reduction, plain or hsdp's, and the copy counts 0 in the gradient norm.

The runs go in turn (``run_many``) in the suite's batched 2-worker (and 4-worker) launches (tests/msrun_batch.py);
the one-process references run here."""
import functools
import os
import tempfile

import numpy as np
import pytest

import run_mindformer
from mindformers_core.models.hf.folder import open_folder
from tests.msrun_batch import computed_ahead, job
from tests.test_hf_msrun import argv, hf_yaml
from tests.test_trainer import records, saved
from tests.test_trainer_msrun import RESUME_AT, assert_close, assert_resumed

pytestmark = pytest.mark.msrun
FOLDER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "hf", "qwen2")
COMMON = ["--runner_config.max_steps", 2, "--lr_schedule.warmup_steps", 0, "--optimizer.eps", 1e-3,
          "--callbacks", "[{type: MFLossMonitor}]"]
TP2 = ["--use_parallel", "True", "--parallel_config.model_parallel", 2]
SP = ["--parallel_config.use_seq_parallel", "True"]
DP2 = ["--use_parallel", "True", "--parallel_config.data_parallel", 2, "--runner_config.batch_size", 2]
PP2 = ["--use_parallel", "True", "--parallel_config.pipeline_stage", 2]
ONE_F_ONE_B = [*PP2, "--runner_config.batch_size", 2, "--parallel_config.micro_batch_num", 2]   # 1 layer a stage
DUALPIPEV = [*PP2, "--runner_config.batch_size", 1, "--parallel_config.micro_batch_num", 4,
             "--parallel.pipeline_config.pipeline_scheduler", "dualpipev",
             "--parallel.pipeline_config.pipeline_interleave", 2,
             "--parallel.pipeline_config.layers_per_stage", "[1, 1, 0, 0]"]   # rank 0: the first and last stages
HSDP3 = ["--parallel.enable_parallel_optimizer", "True", "--hsdp.optimizer_level", "level3"]
DUALPIPE = [*PP2, "--runner_config.batch_size", 1, "--parallel_config.micro_batch_num", 4,
            "--parallel.pipeline_config.pipeline_scheduler", "dualpipe"]      # both ends on each of the 2 ranks
EVERY_STEP = ["--callbacks", "[{type: MFLossMonitor}, {type: CheckpointMonitor, save_checkpoint_steps: 1}]"]
# each layout once (tp2 PyNative and tp2 + SP jit; hsdp level3 PyNative here and under jit with pp2 x dp2 below)
RUNS = {"tp2_pynative": (1, TP2), "tp2_sp_jit": (0, TP2 + SP), "dp2_pynative": (1, DP2),
        "dp2_hsdp3_pynative": (1, DP2 + HSDP3),
        "pp2_1f1b_pynative": (1, ONE_F_ONE_B + EVERY_STEP),
        "pp2_dualpipev_jit": (0, DUALPIPEV), "pp2_dualpipe_pynative": (1, DUALPIPE + EVERY_STEP)}
# (tied under pp in jit: DualPipeV here and pp2 x dp2 with hsdp level3 on 4 workers; the 1F1B and DualPipe jit twins
# were dropped for the suite's time: they passed when added, 2026-11-28)
PP2_DP2 = [*PP2, "--parallel_config.data_parallel", 2, "--runner_config.batch_size", 1,
           "--parallel_config.micro_batch_num", 2]
FOUR_RUNS = {"pp2_tp2_1f1b_pynative": (1, ONE_F_ONE_B + ["--parallel_config.model_parallel", 2]),
             "pp2_dp2_hsdp2_pynative": (1, PP2_DP2 + HSDP3[:-1] + ["level2"]),
             "pp2_dp2_hsdp3_jit": (0, PP2_DP2 + HSDP3)}


def run_argv(config, out, name, flag, *extra):
    return argv(config, out[name], "--mode", flag, *COMMON, *extra, "--export_hf_dir", out[f"{name}_hf"])


def resume_argv(config, out, name, source, *extra):
    """A PyNative run resuming from ``source``'s step-RESUME_AT checkpoint (step 2 again), into ``out[name]``."""
    ckpt = os.path.join(out[source], "checkpoint", f"step_{RESUME_AT}")
    return argv(config, out[name], "--mode", 1, *COMMON, *extra, "--load_checkpoint", ckpt, "--resume_training",
                "True", *EVERY_STEP)


@functools.lru_cache(maxsize=None)
def plan():
    """The runs' output folders (each with ``<name>_hf``, its export) and the 2- and 4-worker argvs (once per
    process). ``pp2_resumed`` resumes the one-process PyNative run's step-1 checkpoint at pp2 (computed ahead,
    before the launch starts)."""
    base = tempfile.mkdtemp(prefix="tied_msrun_")
    config = hf_yaml(base, FOLDER)
    names = ["p1_pynative", "p1_jit", "p1_resumed", "pp2_resumed", *RUNS, *FOUR_RUNS]
    out = {k: os.path.join(base, k) for name in names for k in (name, f"{name}_hf")}
    two = [run_argv(config, out, name, flag, *extra) for name, (flag, extra) in RUNS.items()]
    two.append(resume_argv(config, out, "pp2_resumed", "p1_pynative", *ONE_F_ONE_B))
    four = [run_argv(config, out, name, flag, *extra) for name, (flag, extra) in FOUR_RUNS.items()]
    return config, out, two, four


def _two_worker_argvs():
    one_process_pynative()      # pp2_resumed loads its checkpoint
    return {"argvs": plan()[2]}


TWO = job("tied_tp2_dp2_pp2", 2, "tests.test_hf_msrun:run_many", _two_worker_argvs, timeout=900, group=__name__)
FOUR = job("tied_pp2_tp2", 4, "tests.test_hf_msrun:run_many", lambda: {"argvs": plan()[3]}, timeout=600,
           group=__name__)


@functools.lru_cache(maxsize=None)
def one_process_pynative():
    config, out, _, _ = plan()
    assert run_mindformer.main(run_argv(config, out, "p1_pynative", 1, *EVERY_STEP)) == 0


@computed_ahead
def one_process():
    """The one-process runs (PyNative, jit) into plan()'s p1_* folders."""
    config, out, _, _ = plan()
    one_process_pynative()
    assert run_mindformer.main(run_argv(config, out, "p1_jit", 0)) == 0


@pytest.fixture(scope="module")
def runs():
    config, out, two, four = plan()
    one_process()
    assert TWO.results() == [[0] * len(two)] * 2
    assert FOUR.results() == [[0] * len(four)] * 4
    # the pp2 1F1B run's step-1 checkpoint resumed on one process
    assert run_mindformer.main(resume_argv(config, out, "p1_resumed", "pp2_1f1b_pynative")) == 0
    return out


def test_the_fixture_is_tied():
    folder = open_folder(FOLDER)
    assert folder.config["tie_word_embeddings"] is True and "lm_head.weight" not in folder.tensors


@pytest.mark.parametrize("name", [*RUNS, *FOUR_RUNS])
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


@pytest.mark.parametrize("name", ["pp2_1f1b_pynative", "pp2_dualpipe_pynative"])
def test_pipeline_checkpoint_holds_the_tied_table_once(runs, name):
    """The pp2 run's step-2 checkpoint (DualPipe: 4 holders of the table on 2 ranks, saved by rank 0's first stage):
    the one process's parameter names (the table once, under the embedding's name; no output layer weight) with its
    values."""
    got, want = saved(runs[name], 2)[0], saved(runs["p1_pynative"], 2)[0]
    assert "embedding.word_embeddings.weight" in want and not any("output_layer" in n for n in want)
    assert sorted(got) == sorted(want)
    for name, expect in want.items():
        err = np.abs(np.asarray(got[name], np.float64) - expect).max() / max(np.abs(expect).max(), 1e-12)
        assert err <= 1e-5, f"{name} differs by {err:.2e} of its largest magnitude"


@pytest.mark.parametrize("resumed,uninterrupted", [("p1_resumed", "p1_pynative"), ("pp2_resumed", "p1_pynative")])
def test_tied_pipeline_checkpoints_resume_across_layouts(runs, resumed, uninterrupted):
    """pp2 -> one process and one process -> pp2: step 2 redone from step 1's checkpoint (weights, the last
    stage's copy of the table included, and AdamW moments loaded) = the uninterrupted one-process step 2."""
    assert_resumed(runs[resumed], runs[uninterrupted])
