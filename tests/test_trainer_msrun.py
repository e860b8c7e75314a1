"""The YAML trainer under msrun: one process vs 4 workers (dp2 x tp2) in PyNative and jit, and a
dp2 x tp2 checkpoint resharded into one process and into 2 workers (tp2).

Two msrun launches in all: the 4 workers run the PyNative and then the jit job in the same processes
(``run_mindformer.main`` in turn, through ``run_msrun``), then, in the same launch, the pipeline, hsdp and
context-parallel jobs of ``PIPELINE_JOBS`` (one 4-worker start-up for all of them); the tp2 job starts
``run_mindformer.py`` itself through ``scripts/msrun_launcher.sh``. Both launches start at collection, in
background threads (``launches``), beside the suite's one-process tests; the tp2 launch as soon as the
checkpoint it loads is published. The one-process runs happen in this process, in ``runs``, when the module's
tests come (the resumes wait for the checkpoints they load, most often long published by then). Global batches are equal
everywhere (batch_size 4 on one data-parallel rank, 2 on each of two), so losses must agree per step to a
relative 1e-5.

Resumes: every run saves a checkpoint at steps 1 and 2 and a resumed run loads step 1 and runs step 2. Its
loss (the loaded weights), its lr (the restored step counter) and the AdamW moments of its step-2
checkpoint (m2 = b1 m1 + (1 - b1) g2, v2 likewise: the loaded moments of step 1 carried into step 2) equal
the uninterrupted 4-worker run's. Until the suite had to fit 20 minutes a third step's loss proved the
moments indirectly; the step-2 moments prove them directly, one step earlier.
"""
import os
import shlex
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

import run_mindformer
from mindformers_core.checkpoint import list_steps
from mindformers_core.testing import free_port, run_msrun
from mindformers_core.testing.msrun import child_env, describe_logs, kill_tree
from tests.msrun_batch import LIVE_LAUNCHERS, background, in_background
from tests.test_trainer import ROOT, args, build_assets, config_of, records, saved

# its deadlines (840 s for 4 workers doing ~140 s of work) allow the suite's batched launches alongside
pytestmark = [pytest.mark.msrun, pytest.mark.beside_batch]
STEPS = 2
SHORT = ["--runner_config.max_steps", STEPS, "--lr_schedule.warmup_steps", 0]
DP2_TP2 = ["--use_parallel", "True", "--parallel_config.data_parallel", 2, "--parallel_config.model_parallel", 2,
           "--runner_config.batch_size", 2]
EVERY_STEP = ["--callbacks", "[{type: MFLossMonitor}, {type: CheckpointMonitor, save_checkpoint_steps: 1}]"]
NO_CHECKPOINTS = ["--callbacks", "[{type: MFLossMonitor}]"]
EVAL_AT_END = f"{{type: EvalCallBack, eval_interval: {STEPS}}}"
RESUME_AT = 1              # resumed runs redo step 2: loaded weights (its loss), loaded AdamW moments (step 2's)


def run_many(argvs):
    """msrun body: ``run_mindformer.main`` for each argv in turn, in the same worker process; returns each
    job's (exit code, wall seconds)."""
    done = []
    for argv in argvs:
        start = time.monotonic()
        done.append((run_mindformer.main(argv), round(time.monotonic() - start, 1)))
    return done


def losses(out):
    return [r["loss"] for r in records(out)]


def assert_close(got, want, rel=1e-5):
    assert len(got) == len(want), (got, want)
    worst = max(abs(g - w) / abs(w) for g, w in zip(got, want))
    assert worst <= rel, f"relative difference {worst:.1e} > {rel:.0e}\n got  {got}\n want {want}"


def assert_resumed(resumed, uninterrupted, rel=1e-5):
    """A run resumed from step RESUME_AT of ``uninterrupted``: the same steps after it, the same losses and
    lrs, and the same AdamW moments in its last checkpoint (each tensor's largest difference relative to
    its largest magnitude), whatever the two runs' layouts."""
    got, want = records(resumed), records(uninterrupted)[RESUME_AT:]
    assert [r["step"] for r in got] == list(range(RESUME_AT + 1, STEPS + 1))
    assert_close([r["loss"] for r in got], [r["loss"] for r in want], rel)
    assert [r["lr"] for r in got] == pytest.approx([r["lr"] for r in want], rel=1e-9)
    _, moments, state = saved(resumed, STEPS)
    _, expected, expected_state = saved(uninterrupted, STEPS)
    assert state.trainer_state["step"] == expected_state.trainer_state["step"] == STEPS
    assert {"adam_m", "adam_v"} <= set(expected) and set(moments) == set(expected)
    for kind, tensors in expected.items():
        assert set(moments[kind]) == set(tensors), kind
        for name, want_t in tensors.items():
            scale = float(np.abs(want_t).max())
            err = float(np.abs(moments[kind][name] - want_t).max()) / (scale or 1.0)
            assert err <= rel, f"{kind} {name}: relative difference {err:.1e} > {rel:.0e}"


def launch(command, workers, log_dir, timeout, base=None):
    """``scripts/msrun_launcher.sh "<command>" <workers>``; returns a function waiting for it (with a
    deadline, killing the whole tree) that returns (exit code, output with every rank's log tail).
    ``base``: the environment to start from (default: this process's now)."""
    proc = subprocess.Popen(["bash", os.path.join(ROOT, "scripts", "msrun_launcher.sh"), command, str(workers),
                             str(free_port()), str(log_dir), "True", str(timeout)], cwd=ROOT,
                            env=child_env(base=base), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    LIVE_LAUNCHERS.add(proc.pid)

    def wait():
        try:
            output, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            output = f"killed after {timeout} s"
        finally:
            kill_tree(proc.pid)
            LIVE_LAUNCHERS.discard(proc.pid)
        proc.wait()
        return proc.returncode, f"{output}\n{describe_logs(str(log_dir), workers, os.devnull)}"
    return wait


def published(out, four, timeout=600):
    """``<out>/checkpoint/step_<RESUME_AT>`` once the 4-worker launch ``four`` has published it."""
    directory = os.path.join(str(out), "checkpoint")
    deadline = time.monotonic() + timeout
    while RESUME_AT not in list_steps(directory):
        if four.done():
            four.result()                       # a failed launch raises with every rank's log
            raise AssertionError(f"the 4-worker launch ended without publishing {directory}/step_{RESUME_AT}")
        assert time.monotonic() < deadline, f"{directory}/step_{RESUME_AT} not published within {timeout} s"
        time.sleep(0.5)
    return os.path.join(directory, f"step_{RESUME_AT}")


@background
def launches():
    """The runs' folders and the workers' launches, started at collection (tests/msrun_batch.py ``background``):
    in a thread, 4 workers (dp2 x tp2) run PyNative (checkpoint every step) then jit, then the jobs of
    PIPELINE_JOBS (the one resuming the dp2 x tp2 checkpoint runs after the job that wrote it); in another, as
    soon as the dp2 x tp2 step-1 checkpoint is published, msrun_launcher.sh starts 2 workers (tp2) resuming it.
    The one-process runs are made in ``runs`` (MindSpore is driven from the test thread only). The workers
    start from the environment of now, not what a test running meanwhile sets."""
    root = Path(tempfile.mkdtemp(prefix="trainer_msrun_"))
    tiny = build_assets(str(root / "assets"))
    base = root / "runs"
    out = {k: base / k for k in ("w4_pynative", "w4_jit", "p1_pynative", "p1_jit", "p1_resumed", "p1_weights",
                                 "tp2_resumed")}
    ckpt = out["w4_pynative"] / "checkpoint" / f"step_{RESUME_AT}"
    out["pipeline"] = pipeline = root / "pipeline"
    out["checkpoint"] = ckpt
    evaluate = ["--eval_dataset.dataset_dir", tiny["corpus"], "--eval_dataset.eval_steps", 1]
    jobs = [args(tiny, out["w4_pynative"], "--mode", 1, *SHORT, *DP2_TP2, *evaluate, "--callbacks",
                 f"{EVERY_STEP[1][:-1]}, {EVAL_AT_END}]"),
            args(tiny, out["w4_jit"], "--mode", 0, *SHORT, *DP2_TP2, *NO_CHECKPOINTS)]
    jobs += [args(tiny, pipeline / name, "--mode", mode, *SHORT,
                  *[ckpt if f == DP2_TP2_CHECKPOINT else f for f in flags])
             for name, (mode, flags) in PIPELINE_JOBS.items()]
    resume = ["--resume_training", "True", *SHORT, *EVERY_STEP]
    environment = dict(os.environ)

    def run_four():
        return run_msrun("tests.test_trainer_msrun:run_many", 4, {"argvs": jobs}, timeout=840, base_env=environment)

    def run_tp2():
        published(out["w4_pynative"], four)
        return launch(shlex.join(["run_mindformer.py", *map(str, args(
            tiny, out["tp2_resumed"], "--use_parallel", "True", "--parallel_config.model_parallel", 2,
            "--load_checkpoint", ckpt, *resume))]), 2, base / "tp2_logs", timeout=300, base=environment)()
    four = in_background("trainer-msrun-run_four", run_four)
    tp2 = in_background("trainer-msrun-run_tp2", run_tp2)
    return {"tiny": tiny, "out": out, "resume": resume, "evaluate": evaluate, "four": four, "tp2": tp2}


@pytest.fixture(scope="module")
def tiny():
    return launches()["tiny"]


@pytest.fixture(scope="module")
def runs(tiny):
    """The one-process runs, here, beside the workers' launches of ``launches`` (started at collection):
    the dp2 x tp2 jobs on one process; once the dp2 x tp2 step-1 checkpoint is published, the same resumed
    on one process and a weights-only load of it; as each RESUMED job publishes its step-1 checkpoint, that
    job resumed on one process."""
    started = launches()
    out, resume, evaluate, four = dict(started["out"]), started["resume"], started["evaluate"], started["four"]
    pipeline, ckpt = out["pipeline"], out["checkpoint"]
    for mode, flag in (("pynative", 1), ("jit", 0)):
        callbacks = ([*evaluate, "--callbacks", f"{NO_CHECKPOINTS[1][:-1]}, {EVAL_AT_END}]"] if flag == 1
                     else NO_CHECKPOINTS)
        assert run_mindformer.main(args(tiny, out[f"p1_{mode}"], "--mode", flag, *SHORT, *callbacks)) == 0
    published(out["w4_pynative"], four)
    assert run_mindformer.main(args(tiny, out["p1_resumed"], "--load_checkpoint", ckpt, *resume)) == 0
    out["weights_argv"] = args(tiny, out["p1_weights"], "--load_checkpoint", ckpt,
                               "--runner_config.max_steps", 1, *NO_CHECKPOINTS)
    assert run_mindformer.main(out["weights_argv"]) == 0
    for job in RESUMED:                  # in the launch's job order
        step1 = published(pipeline / job, four)
        assert run_mindformer.main(args(tiny, pipeline / f"{job}_resumed", "--load_checkpoint", step1,
                                        *resume)) == 0
    done = four.result()
    print("4-worker jobs (seconds on rank 0): " + ", ".join(
        f"{name} {secs}" for name, (_, secs) in zip(["dp2_tp2_pynative", "dp2_tp2_jit", *PIPELINE_JOBS], done[0])))
    assert [[code for code, _ in rank] for rank in done] == [[0] * (2 + len(PIPELINE_JOBS))] * 4
    out["tp2_result"] = started["tp2"].result()
    return out


@pytest.mark.parametrize("mode", ["pynative", "jit"])
def test_four_workers_match_one_process(runs, mode):
    one, four = losses(runs[f"p1_{mode}"]), losses(runs[f"w4_{mode}"])
    assert len(one) == STEPS and one[-1] < one[0]
    assert_close(four, one)


def test_eval_callback_four_workers_match_one_process(runs):
    """EvalCallBack on dp2 x tp2: each data-parallel rank evaluates its share of the held-out batch,
    the model's loss is the global mean: one process's number."""
    one, four = records(runs["p1_pynative"])[-1], records(runs["w4_pynative"])[-1]
    assert "eval_loss" in one and "eval_loss" in four
    assert_close([four["eval_loss"]], [one["eval_loss"]])


def test_jit_matches_pynative(runs):
    assert_close(losses(runs["p1_jit"]), losses(runs["p1_pynative"]), rel=1e-4)


def test_dp2_tp2_checkpoint_resumes_on_one_process(runs):
    """Weights and AdamW moments resharded dp2 x tp2 -> 1, the data position re-split over 1 rank, the
    step counter restored: the resumed step gives the 4-worker run's loss, lr and moments."""
    assert_resumed(runs["p1_resumed"], runs["w4_pynative"])


def test_dp2_tp2_checkpoint_resumes_on_two_workers_tp2(runs):
    """The same checkpoint into model_parallel 2 on 2 workers, started with scripts/msrun_launcher.sh."""
    code, output = runs["tp2_result"]
    assert code == 0, output
    assert_resumed(runs["tp2_resumed"], runs["w4_pynative"])


def test_dp2_tp2_weights_load_on_one_process(runs, tiny, tmp_path):
    """--load_checkpoint without resume: step 1 of a fresh data pass on the loaded weights equals the
    loss of an unparallelized model holding the merged checkpoint, on the same batch."""
    from mindspore import Tensor
    from mindformers_core.data.dataset import PackedDataset
    from mindformers_core.data.tokenizer import LlamaTokenizer
    from mindformers_core.models.llama import LlamaConfig, LlamaForCausalLM
    [loaded] = losses(runs["p1_weights"])
    cfg = config_of(runs["weights_argv"])
    model = LlamaForCausalLM(LlamaConfig.from_model_config(cfg.model.model_config))
    weights, _, _ = saved(runs["w4_pynative"], RESUME_AT)
    for p in model.trainable_params():
        p.set_data(Tensor(weights[p.name]))
    data = PackedDataset([tiny["corpus"]], LlamaTokenizer(tiny["tokenizer"]), cfg.model.model_config.seq_length,
                         cache_dir=str(tmp_path / "cache"), seed=cfg.seed, shuffle=True)
    batch = [s for _, s in zip(range(cfg.runner_config.batch_size), data)]
    ids, labels = (np.stack([b[i] for b in batch]) for i in (0, 1))
    expected = float(model(Tensor(ids), Tensor(labels)).asnumpy())
    assert loaded == pytest.approx(expected, rel=1e-5)
    assert abs(loaded - losses(runs["p1_pynative"])[0]) > 1e-3     # not the initial weights


PP2 = ["--use_parallel", "True", "--parallel_config.pipeline_stage", 2, "--parallel_config.micro_batch_num", 2]
VIRTUAL = ["--parallel.pipeline_config.pipeline_interleave", 2, "--parallel.pipeline_config.layers_per_stage",
           "[0, 1, 1, 0]"]      # 4 stages for the 2 layers: the embedding and the head get stages of their own
HSDP = ["--parallel.enable_parallel_optimizer", "True", "--hsdp.threshold", 1]   # 1 KB: the tiny weights shard
DP2_TP2_CHECKPOINT = "<the dp2 x tp2 run's step-1 checkpoint>"    # replaced by its path in runs
PIPELINE_JOBS = {   # name -> (mode, flags); every job takes 4 rows per step, like the one-process reference
    "pp2_tp2_sp_1f1b": (1, PP2 + ["--parallel_config.model_parallel", 2, "--parallel_config.use_seq_parallel", "True",
                                  "--runner_config.batch_size", 2] + EVERY_STEP),
    "pp2_dp2_zbv_hsdp_level2": (0, PP2 + VIRTUAL + HSDP + [
        "--hsdp.optimizer_level", "level2", "--parallel_config.data_parallel", 2, "--runner_config.batch_size", 1,
        "--parallel.pipeline_config.pipeline_scheduler", "zbv"] + NO_CHECKPOINTS),
    "dp2_tp2_hsdp_level3": (1, DP2_TP2 + HSDP + ["--hsdp.optimizer_level", "level3"] + EVERY_STEP),
    # pipeline fastest: each pipeline pair is neighbouring ranks, a stage's tp group is ranks {0, 2} / {1, 3}
    "pp2_tp2_rank_order_pp_tp_dp": (1, PP2 + ["--parallel_config.model_parallel", 2, "--runner_config.batch_size", 2,
                                             "--parallel_config.rank_order", "pp-tp-dp"] + NO_CHECKPOINTS),
    "pp2_tp2_interleaved_accumulate2": (0, PP2 + VIRTUAL + [
        "--parallel_config.model_parallel", 2, "--runner_config.batch_size", 1,
        "--runner_config.gradient_accumulation_steps", 2,
        "--parallel.pipeline_config.pipeline_scheduler", "interleaved"] + NO_CHECKPOINTS),
    # context parallel: the sequence split over cp (ring with zigzag balancing; Ulysses with tp, GQA heads repeated)
    # with hsdp level3 under jit (hsdp sums gradients over cp before its dp reduce-scatter; each unit is a
    # compiled island differentiated from PyNative, the cp kernel's backward inside); its checkpoint
    # (moments gathered from shards) resumes on one process. It is also the trainer's level3 job without
    # tensor parallel (the embedding a plain lookup whose full shape parallelize's trace cached: the bug
    # fixed in 726c702), which a dp4 level3 jit job proved on its own until the suite had to fit 20 minutes
    # (hsdp level3 at dp4 is proven on the MLP by tests/test_hsdp_msrun.py's hsdp_4 job)
    "dp2_cp2_ring_hsdp_level3": (0, HSDP + ["--use_parallel", "True", "--parallel_config.data_parallel", 2,
                                            "--parallel_config.context_parallel", 2, "--runner_config.batch_size", 2,
                                            "--hsdp.optimizer_level", "level3"] + EVERY_STEP),
    # cp x pp in both modes: ring under jit; Ulysses in PyNative with every layer recomputed, resuming the
    # step-1 checkpoint of the dp2 x tp2 run (no cp) as the one-process resumed run does
    "pp2_cp2_ring_1f1b": (0, PP2 + ["--parallel_config.context_parallel", 2, "--runner_config.batch_size", 2]
                          + NO_CHECKPOINTS),
    "pp2_cp2_ulysses_1f1b_recompute_resumed": (1, PP2 + [
        "--parallel_config.context_parallel", 2, "--parallel_config.context_parallel_algo", "ulysses",
        "--runner_config.batch_size", 2, "--recompute_config.recompute", "True", "--load_checkpoint",
        DP2_TP2_CHECKPOINT, "--resume_training", "True"] + NO_CHECKPOINTS),
    # the attention (the cp kernel) recomputed by select_recompute under jit
    "cp2_tp2_ulysses_select_recompute": (0, ["--use_parallel", "True", "--parallel_config.model_parallel", 2,
                                             "--parallel_config.context_parallel", 2,
                                             "--parallel_config.context_parallel_algo", "ulysses",
                                             "--recompute_config.select_recompute",
                                             "['self_attention.core_attention']"] + NO_CHECKPOINTS),
}


RESUMED = ["pp2_tp2_sp_1f1b", "dp2_tp2_hsdp_level3", "dp2_cp2_ring_hsdp_level3"]
# Every job runs STEPS = 2 steps, compared with the one-process run's: step 2 already carries the weights
# and AdamW moments of step 1 across a step boundary, which is what a third step would prove again (the
# suite's 20-minute budget). The RESUMED jobs' step-1 checkpoints (stage-local names, moments gathered from
# shards) are resumed on one process in ``runs``, while the launch goes on. The job resuming the dp2 x tp2
# checkpoint runs step 2 only: it proves cp x pp x recompute on loaded weights; resumed moments are proven by
# the three RESUMED jobs and the dp2 x tp2 resumes above.


@pytest.mark.parametrize("name", list(PIPELINE_JOBS))
def test_pipeline_jobs_match_one_process(runs, name):
    mode = "jit" if PIPELINE_JOBS[name][0] == 0 else "pynative"
    pipeline = runs["pipeline"]
    if DP2_TP2_CHECKPOINT in PIPELINE_JOBS[name][1]:     # resumed: step 2 of the one-process resumed run
        assert [r["step"] for r in records(pipeline / name)] == list(range(RESUME_AT + 1, STEPS + 1))
        assert_close(losses(pipeline / name), losses(runs["p1_resumed"]))
        return
    assert [r["step"] for r in records(pipeline / name)] == list(range(1, STEPS + 1))
    assert_close(losses(pipeline / name), losses(runs[f"p1_{mode}"]))


@pytest.mark.parametrize("job", RESUMED)
def test_pipeline_and_hsdp_checkpoints_resume_on_one_process(runs, job):
    """Stage-local layer names are saved as global ones; hsdp's sharded weights and AdamW moments are
    saved whole; context parallel does not split weights: pp2 x tp2, dp2 x tp2 (level3) and dp2 x cp2
    -> one process, exact resume (loss, lr and the step-2 moments)."""
    assert_resumed(runs["pipeline"] / f"{job}_resumed", runs["pipeline"] / job)
