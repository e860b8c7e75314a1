"""``pipeline_scheduler: dualpipe`` (the bidirectional DualPipe) through the YAML trainer under msrun,
against one process of the same model, data and seed taking the batch in the same 4 slices (gradient
accumulation: the pipeline's microbatches), relative 1e-5 every step.

One batched job on 2 workers (pp2; ``tests/msrun_batch.py``) runs ``run_mindformer.main`` in turn in the
same processes: DualPipe in PyNative (a checkpoint every step), DualPipe under jit, DualPipe resuming the
one-process run's step-1 checkpoint, DualPipe with every layer recomputed, and 1F1B and DualPipeV resuming
the DualPipe run's step-1 checkpoint. Rank r holds model stage r (the down copy) and a second copy of model
stage 1-r (the up copy), so each rank holds the embedding and the head once; 4 microbatches, the first two
down the pipeline, the last two up.

A second batched job on 4 workers: pp2 x dp2 DualPipe under jit and pp2 x tp2 DualPipe in PyNative, against
one process the same way (loss and gradient norm every step).

Checkpoints: a DualPipe run saves one copy of each model stage under the one-chain model's names, so its
step-1 checkpoint holds exactly the parameters (and AdamW moments) of the one-process checkpoint, equal to
them; it resumes on one process, and the one-process checkpoint resumes in DualPipe (loading fills both
copies): the resumed step's loss, lr and step-2 moments equal the uninterrupted run's.
"""
import os
import tempfile

import numpy as np
import pytest

import run_mindformer
from tests.msrun_batch import computed_ahead, job
from tests.test_trainer import args, build_assets, records, saved
from tests.test_trainer_msrun import (EVERY_STEP, NO_CHECKPOINTS, RESUME_AT, SHORT, STEPS, assert_close,
                                      assert_resumed, losses)

pytestmark = pytest.mark.msrun
DUALPIPE = ["--use_parallel", "True", "--parallel_config.pipeline_stage", 2, "--parallel_config.micro_batch_num", 4,
            "--parallel.pipeline_config.pipeline_scheduler", "dualpipe"]
# the one-process reference takes the batch in the same 4 slices (accumulated micro-steps): the loss is a
# mean over each slice's labelled tokens, so 4 slices of 1 row differ from one batch of 4 rows (5.9620 vs
# 5.9882 at step 1, for 1F1B with micro_batch_num 4 as for DualPipe)
ONE = ["--runner_config.gradient_accumulation_steps", 4]
RESUME = ["--resume_training", "True", *SHORT, *EVERY_STEP]
PIPELINE = ["--use_parallel", "True", "--parallel_config.pipeline_stage", 2, "--parallel_config.micro_batch_num", 4]
# the DualPipe step-1 checkpoint resumed by the other pipeline schedules (same 4 microbatches)
FROM_DUALPIPE = {"pp2_1f1b_from_dualpipe": [],
                 "pp2_dualpipev_from_dualpipe": ["--parallel.pipeline_config.pipeline_scheduler", "dualpipev",
                                                 "--parallel.pipeline_config.pipeline_interleave", 2,
                                                 "--parallel.pipeline_config.layers_per_stage", "[0, 1, 1, 0]"]}
ASSETS = os.path.join(tempfile.gettempdir(), f"mfc_dualpipe_trainer_{os.getpid()}")
_RUNS = {}


def _step(out):
    return os.path.join(str(out), "checkpoint", f"step_{RESUME_AT}")


def _kwargs():
    """At the launch: the one-process PyNative run (a checkpoint every step; the DualPipe resume loads its
    step 1), then the 2-worker jobs' argv lists."""
    tiny = build_assets(ASSETS)
    root = tempfile.mkdtemp(prefix="mfc_dualpipe_trainer_")
    out = {k: os.path.join(root, k) for k in ("p1_pynative", "p1_jit", "p1_resumed", "pp2_pynative", "pp2_jit",
                                              "pp2_resumed", "pp2_recompute", *FROM_DUALPIPE)}
    _RUNS.update(out, tiny=tiny)
    assert run_mindformer.main(args(tiny, out["p1_pynative"], "--mode", 1, *ONE, *SHORT, *EVERY_STEP)) == 0
    return {"argvs": [args(tiny, out["pp2_pynative"], "--mode", 1, *SHORT, *DUALPIPE, *EVERY_STEP),
                      args(tiny, out["pp2_jit"], "--mode", 0, *SHORT, *DUALPIPE, *NO_CHECKPOINTS),
                      args(tiny, out["pp2_resumed"], "--mode", 1, *DUALPIPE, "--load_checkpoint",
                           _step(out["p1_pynative"]), *RESUME),
                      args(tiny, out["pp2_recompute"], "--mode", 1, *SHORT, *DUALPIPE, "--recompute_config.recompute",
                           "True", *NO_CHECKPOINTS)]
            + [args(tiny, out[name], "--mode", 1, *PIPELINE, *flags, "--load_checkpoint", _step(out["pp2_pynative"]),
                    *RESUME) for name, flags in FROM_DUALPIPE.items()]}


PP2 = job("trainer_dualpipe_pp2", 2, "tests.test_trainer_msrun:run_many", _kwargs, timeout=600, group=__name__)
# 4 workers: DualPipe with data parallel (jit; each dp replica's mirror pair sums its copies, then the dp
# average; 4 rows per replica in 4 microbatches: the two replicas' microbatch i together are one slice of the
# 8-row global batch, the loss normalised over its labelled tokens, so the reference is one process taking the
# 8 rows in 4 slices) and with tensor-parallel stages (PyNative; the copies' gradients summed between the same
# tp positions; the 4-row reference)
W4_JOBS = {"pp2_dp2_jit": (0, ["--parallel_config.data_parallel", 2, "--runner_config.batch_size", 4], "p1_b8_jit"),
           "pp2_tp2_pynative": (1, ["--parallel_config.model_parallel", 2], "p1_pynative")}


def _kwargs4():
    tiny = build_assets(ASSETS)
    root = tempfile.mkdtemp(prefix="mfc_dualpipe_trainer4_")
    _RUNS.update({name: os.path.join(root, name) for name in W4_JOBS}, tiny=tiny)
    return {"argvs": [args(tiny, _RUNS[name], "--mode", mode, *SHORT, *DUALPIPE, *extra, *NO_CHECKPOINTS)
                      for name, (mode, extra, _) in W4_JOBS.items()]}


W4 = job("trainer_dualpipe_w4", 4, "tests.test_trainer_msrun:run_many", _kwargs4, timeout=600, group=__name__)


@computed_ahead
def one_process_jit():
    """The one-process jit run (into the folder the launch's kwargs named)."""
    assert run_mindformer.main(args(_RUNS["tiny"], _RUNS["p1_jit"], "--mode", 0, *ONE, *SHORT, *NO_CHECKPOINTS)) == 0


@computed_ahead
def one_process_8_rows_jit():
    """The reference of the dp2 DualPipe job: one process taking the 8 rows in 4 slices, jit; its folder."""
    out = os.path.join(os.path.dirname(_RUNS["p1_jit"]), "p1_b8_jit")
    assert run_mindformer.main(args(_RUNS["tiny"], out, "--mode", 0, "--runner_config.batch_size", 8,
                                    "--runner_config.gradient_accumulation_steps", 4, *SHORT, *NO_CHECKPOINTS)) == 0
    return out


@pytest.fixture(scope="module")
def runs():
    done = PP2.results()
    print("dualpipe pp2 jobs (seconds on rank 0): " + ", ".join(
        f"{name} {secs}" for name, (_, secs) in zip(["pynative", "jit", "resumed", "recompute", *FROM_DUALPIPE],
                                                    done[0])))
    assert [[code for code, _ in rank] for rank in done] == [[0] * (4 + len(FROM_DUALPIPE))] * 2
    tiny = _RUNS["tiny"]
    one_process_jit()
    # the DualPipe run's step-1 checkpoint resumed on one process
    assert run_mindformer.main(args(tiny, _RUNS["p1_resumed"], "--load_checkpoint", _step(_RUNS["pp2_pynative"]),
                                    *ONE, *RESUME)) == 0
    return _RUNS


@pytest.mark.parametrize("mode", ["pynative", "jit"])
def test_dualpipe_pp2_matches_one_process(runs, mode):
    one, two = losses(runs[f"p1_{mode}"]), losses(runs[f"pp2_{mode}"])
    assert [r["step"] for r in records(runs[f"pp2_{mode}"])] == list(range(1, STEPS + 1))
    assert len(one) == STEPS and one[-1] < one[0]
    assert_close(two, one)
    # the global norm counts each of the two copies of a model stage once: the one-process norm (clipped at 1.0)
    assert_close([r["grad_norm"] for r in records(runs[f"pp2_{mode}"])],
                 [r["grad_norm"] for r in records(runs[f"p1_{mode}"])])


@pytest.fixture(scope="module")
def runs4(runs):
    done = W4.results()
    print("dualpipe 4-worker jobs (seconds on rank 0): " + ", ".join(
        f"{name} {secs}" for name, (_, secs) in zip(W4_JOBS, done[0])))
    assert [[code for code, _ in rank] for rank in done] == [[0] * len(W4_JOBS)] * 4
    runs["p1_b8_jit"] = one_process_8_rows_jit()
    return runs


@pytest.mark.parametrize("name", list(W4_JOBS))
def test_dualpipe_with_dp_or_tp_matches_one_process(runs4, name):
    reference = runs4[W4_JOBS[name][2]]
    assert [r["step"] for r in records(runs4[name])] == list(range(1, STEPS + 1))
    for key in ("loss", "grad_norm"):
        assert_close([r[key] for r in records(runs4[name])], [r[key] for r in records(reference)])


def test_dualpipe_checkpoint_holds_the_one_chain_model(runs):
    """One copy of every model stage, under the one-process names: the same parameter and moment names as
    the one-process step-1 checkpoint, the AdamW moments equal (relative 1e-5 of each tensor's largest) and
    the weights too, up to 1% of the step's lr: AdamW's first update is lr * g / (|g| + eps), and for a
    gradient near eps (measured: -7.76e-10 vs -7.71e-10, a rounding-level difference of two summation
    orders) it moves by a few thousandths of lr (1.8e-6 at lr 1e-3)."""
    weights, moments, _ = saved(runs["pp2_pynative"], RESUME_AT)
    want_w, want_m, _ = saved(runs["p1_pynative"], RESUME_AT)
    lr = records(runs["p1_pynative"])[0]["lr"]
    assert set(weights) == set(want_w) and len(want_w) > 10
    assert set(moments) == set(want_m) == {"adam_m", "adam_v"}
    for kind, tensors in want_m.items():
        assert set(moments[kind]) == set(tensors), kind
        for name, want in tensors.items():
            err = float(np.abs(moments[kind][name] - want).max()) / (float(np.abs(want).max()) or 1.0)
            assert err <= 1e-5, f"{kind} {name}: relative difference {err:.1e}"
    for name, want in want_w.items():
        err = float(np.abs(weights[name] - want).max())
        assert err <= 1e-5 * float(np.abs(want).max()) + 1e-2 * lr, f"{name}: difference {err:.1e}"


def test_dualpipe_checkpoint_resumes_on_one_process(runs):
    assert_resumed(runs["p1_resumed"], runs["pp2_pynative"])


def test_one_process_checkpoint_resumes_in_dualpipe(runs):
    """Loading fills both copies of every model stage (weights and AdamW moments by name)."""
    assert_resumed(runs["pp2_resumed"], runs["p1_pynative"])


@pytest.mark.parametrize("name", list(FROM_DUALPIPE))
def test_dualpipe_checkpoint_resumes_in_1f1b_and_dualpipev(runs, name):
    """The one-chain names load into one copy per stage (1F1B) and into DualPipeV's V of 4 stages."""
    assert_resumed(runs[name], runs["pp2_pynative"])


def test_dualpipe_with_recompute_matches_one_process(runs):
    """recompute_config.recompute on both copies of every stage (PyNative: each stage recomputes as a whole)."""
    assert_close(losses(runs["pp2_recompute"]), losses(runs["p1_pynative"]))
