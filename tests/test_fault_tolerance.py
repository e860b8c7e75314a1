"""Faults on one process: bad steps skipped with the state untouched, non-finite checkpoints never
published, corrupt shards detected with the intact step named, crash leftovers removed, honest exit
codes (1 for a stopped run, 130 for Ctrl-C), the fault-injection hook.

Runs go through ``run_mindformer.main`` on tests/test_trainer.py's tiny config (2 layers, seq 32).
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import run_mindformer
from mindformers_core.training.faults import Fault, parse_faults
from tests.test_trainer import ROOT, args, saved, steps_in, tiny  # noqa: F401  (tiny: fixture)

EVERY_STEP = ["--callbacks", "[{type: MFLossMonitor}, {type: CheckpointMonitor, save_checkpoint_steps: 1, "
                             "keep_checkpoint_max: 10}]"]


def strict_records(out):
    """loss.jsonl read by a JSON parser that refuses NaN/Infinity (they are not JSON)."""
    def refuse(token):
        raise ValueError(f"loss.jsonl holds {token}, which is not JSON")
    with open(os.path.join(str(out), "loss.jsonl")) as f:
        return [json.loads(line, parse_constant=refuse) for line in f]


# ---- pure logic -----------------------------------------------------------------------------------
def test_fault_specs_parse_and_bad_ones_are_named():
    assert parse_faults("exit:1:3, nan:*:2") == [Fault("exit", 1, 3), Fault("nan", None, 2)]
    assert parse_faults(None) == [] and parse_faults("") == []
    for bad in ("boom:1:3", "exit:x:3", "exit:1:0", "exit:1"):
        with pytest.raises(ValueError, match=r"MFC_FAULT=.*kind:rank:step"):
            parse_faults(bad)


def test_step_guard_decides_like_the_graph():
    import mindspore as ms
    from mindformers_core.optim import StepGuard
    guard = StepGuard(True, 2.0)
    for norm in (1.0, 2.0, 2.5, float("nan"), float("inf")):
        in_graph = bool(guard(ms.Tensor(norm, ms.float32)).asnumpy())
        assert in_graph == guard.is_ok(norm) == (np.isfinite(norm) and norm <= 2.0)
    assert not StepGuard(False, None).enabled
    with pytest.raises(ValueError, match="norm_threshold=-1"):
        StepGuard(True, -1)


@pytest.mark.parametrize("mode", ["pynative", "jit"])
def test_adamw_skipped_step_leaves_weights_moments_and_counter(mode):
    import mindspore as ms
    from mindspore import Parameter, Tensor
    from mindformers_core.optim import AdamW
    p = Parameter(Tensor(np.arange(4, dtype=np.float32)), name="w")
    opt = AdamW([p], 0.1, weight_decay=0.01)
    def apply(g, ok):
        return opt(g, ok)
    jitted = ms.jit(apply)

    def step(g, ok):       # a tuple of Tensors is a constant to ms.jit unless mutable
        return jitted(ms.mutable(g), ok) if mode == "jit" else apply(g, ok)
    step((Tensor(np.ones(4, np.float32)),), Tensor(True))
    before = [p.asnumpy().copy(), opt.moment1[0].asnumpy().copy(), opt.moment2[0].asnumpy().copy()]
    step((Tensor(np.full(4, np.nan, np.float32)),), Tensor(False))
    after = [p.asnumpy(), opt.moment1[0].asnumpy(), opt.moment2[0].asnumpy()]
    assert all(np.array_equal(a, b) for a, b in zip(before, after))
    assert int(opt.global_step.asnumpy()) == 1
    step((Tensor(np.ones(4, np.float32)),), Tensor(True))
    assert int(opt.global_step.asnumpy()) == 2 and not np.array_equal(p.asnumpy(), before[0])


def test_hsdp_train_step_skips_a_bad_step():
    """hsdp owns its update: the guard is threaded into it (1 process, level1)."""
    import mindspore as ms
    from mindspore import Parameter, Tensor, nn, ops
    from mindformers_core.hsdp import hsdp
    from mindformers_core.optim import AdamW, StepGuard

    class Tiny(nn.Cell):
        def __init__(self):
            super().__init__()
            self.w = Parameter(Tensor(np.ones((4, 4), np.float32)), name="w")
            self.poison = Parameter(Tensor(1.0, ms.float32), name="poison", requires_grad=False)

        def construct(self, x):
            return (ops.matmul(x, self.w) * self.poison).sum()

    model = Tiny()
    wrapped = hsdp(model, shard_size=1, threshold=0, optimizer_level="level1")
    opt = AdamW([model.w], 0.1)
    step = wrapped.train_step(model, opt, max_grad_norm=float("inf"), step_guard=StepGuard(True))
    x = Tensor(np.ones((2, 4), np.float32))
    step(x)
    before = (model.w.asnumpy().copy(), opt.moment1[0].asnumpy().copy())
    ops.assign(model.poison, Tensor(float("nan"), ms.float32))
    step(x)
    assert not np.isfinite(float(step.grad_norm))
    assert np.array_equal(model.w.asnumpy(), before[0]) and np.array_equal(opt.moment1[0].asnumpy(), before[1])
    assert int(opt.global_step.asnumpy()) == 1


# ---- the trainer ----------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["1", "0"])
def test_a_nan_step_is_skipped_with_the_state_untouched(tiny, tmp_path, monkeypatch, mode):
    monkeypatch.setenv("MFC_FAULT", "nan:*:2")
    out = tmp_path / "run"
    assert run_mindformer.main(args(tiny, out, "--mode", mode, *EVERY_STEP)) == 0
    recs = strict_records(out)
    assert [r.get("skipped", False) for r in recs] == [False, True, False, False]
    assert recs[1]["grad_norm"] is None and np.isfinite(recs[1]["loss"])
    assert recs[2]["lr"] == recs[1]["lr"]                       # the lr position did not move either
    assert all(np.isfinite(r["loss"]) and np.isfinite(r["grad_norm"]) for r in (recs[0], recs[2], recs[3]))
    w1, o1, s1 = saved(out, 1)
    w2, o2, s2 = saved(out, 2)
    assert all(np.array_equal(w1[k], w2[k]) for k in w1)        # weights of step 2 = those of step 1
    assert all(np.array_equal(o1[s][k], o2[s][k]) for s in o1 for k in o1[s])   # AdamW moments too
    assert s1.trainer_state["optimizer_step"] == s2.trainer_state["optimizer_step"] == 1
    w3, _, s3 = saved(out, 3)
    assert s3.trainer_state["optimizer_step"] == 2 and not all(np.array_equal(w2[k], w3[k]) for k in w2)


def test_resume_after_a_skipped_step_equals_the_uninterrupted_run(tiny, tmp_path, monkeypatch):
    monkeypatch.setenv("MFC_FAULT", "nan:*:2")
    whole, part = tmp_path / "whole", tmp_path / "part"
    assert run_mindformer.main(args(tiny, whole, *EVERY_STEP)) == 0
    assert run_mindformer.main(args(tiny, part, *EVERY_STEP, "--runner_config.max_steps", 2)) == 0
    monkeypatch.delenv("MFC_FAULT")
    assert run_mindformer.main(args(tiny, part, *EVERY_STEP, "--resume_training", "True")) == 0
    assert strict_records(part) == [dict(r, step_time_s=p["step_time_s"], tokens_per_s=p["tokens_per_s"])
                                    for r, p in zip(strict_records(whole), strict_records(part))]


def test_consecutive_skips_stop_the_run_with_exit_1(tiny, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MFC_FAULT", "nan:*:2,nan:*:3")
    out = tmp_path / "run"
    assert run_mindformer.main(args(tiny, out, *EVERY_STEP, "--runner_config.max_consecutive_skipped_steps",
                                    2)) == 1
    err = capsys.readouterr().err
    assert "training stopped: step 3: 2 steps in a row skipped" in err and "weights are those of step 1" in err
    assert [r["step"] for r in strict_records(out)] == [1, 2, 3] and steps_in(out) == [1, 2]


def test_without_the_guard_a_nan_step_stops_and_publishes_nothing(tiny, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MFC_FAULT", "nan:*:2")
    out = tmp_path / "run"
    assert run_mindformer.main(args(tiny, out, *EVERY_STEP, "--runner_config.use_skip_step_on_nan", "False",
                                    "--runner_config.max_grad_norm", 0)) == 1
    assert "use_skip_step_on_nan is off" in capsys.readouterr().err
    assert steps_in(out) == [1]                                 # the poisoned step 2 was not published
    assert strict_records(out)[1]["grad_norm"] is None


def test_a_huge_learning_rate_never_publishes_non_finite_weights(tiny, tmp_path):
    out = tmp_path / "run"
    code = run_mindformer.main(args(tiny, out, *EVERY_STEP, "--lr_schedule.learning_rate", "1e38",
                                    "--optimizer.learning_rate", "1e38", "--runner_config.max_grad_norm", 0,
                                    "--runner_config.max_consecutive_skipped_steps", 2))
    assert code in (0, 1)
    assert steps_in(out)
    for step in steps_in(out):
        weights, moments, _ = saved(out, step)
        assert all(np.isfinite(v).all() for v in weights.values())
        assert all(np.isfinite(v).all() for m in moments.values() for v in m.values())
    strict_records(out)


def test_a_corrupt_latest_step_names_the_intact_one(tiny, tmp_path, capsys):
    out = tmp_path / "run"
    assert run_mindformer.main(args(tiny, out, *EVERY_STEP, "--runner_config.max_steps", 3)) == 0
    shard = out / "checkpoint" / "step_3" / "rank_0.safetensors"
    data = bytearray(shard.read_bytes())
    data[-5] ^= 0xFF                                            # one flipped byte in the tensor data
    shard.write_bytes(bytes(data))
    assert run_mindformer.main(args(tiny, out, *EVERY_STEP, "--resume_training", "True")) == 2
    err = capsys.readouterr().err
    assert "rank_0.safetensors" in err and "corrupt" in err
    assert "step_2 in" in err and "is intact: load it with --resume_training step_2" in err
    assert "resume_fallback_to_intact: True" in err
    auto = tmp_path / "auto"
    shutil.copytree(out, auto)
    assert run_mindformer.main(args(tiny, out, *EVERY_STEP, "--resume_training", "step_2")) == 0
    assert [r["step"] for r in strict_records(out)] == [1, 2, 3, 4]
    # opted in: the same resume loads step_2 by itself, with a warning, and trains the same steps
    assert run_mindformer.main(args(tiny, auto, *EVERY_STEP, "--resume_training", "True",
                                    "--resume_fallback_to_intact", "True")) == 0
    text = capsys.readouterr().out
    assert "step_3" in text and "fails verification" in text and "loading step_2, the newest intact step" in text
    assert [(r["step"], r["loss"]) for r in strict_records(auto)] == [(r["step"], r["loss"])
                                                                      for r in strict_records(out)]


def test_leftovers_of_interrupted_saves_are_removed(tiny, tmp_path):
    out = tmp_path / "run"
    assert run_mindformer.main(args(tiny, out, *EVERY_STEP, "--runner_config.max_steps", 2)) == 0
    ckpt = out / "checkpoint"
    (ckpt / "step_9.tmp").mkdir()
    (ckpt / "step_9.tmp" / "rank_0.safetensors").write_bytes(b"x" * 100)
    (ckpt / "step_1.old-4242").mkdir()
    (ckpt / "latest_checkpointed_iteration.txt.tmp-77").write_text("9\n")
    assert run_mindformer.main(args(tiny, out, *EVERY_STEP, "--resume_training", "True")) == 0
    assert sorted(os.listdir(ckpt)) == ["latest_checkpointed_iteration.txt", "step_1", "step_2", "step_3",
                                         "step_4"]


@pytest.mark.parametrize("mode", ["1", "0"], ids=["pynative", "jit"])
def test_ctrl_c_exits_130_with_a_message(tiny, tmp_path, mode):
    """SIGINT while the run steps. MindSpore installs a SIGINT handler of its own (SignalGuard: around every
    graph launch, and for the life of the PyNative op-queue threads) that turns Ctrl-C into SIGTERM; the
    trainer's command line must still end with 130 and the message in both modes."""
    out = tmp_path / "run"
    env = dict(os.environ, PYTHONPATH=ROOT)
    proc = subprocess.Popen([sys.executable, "run_mindformer.py", *args(tiny, out, "--runner_config.max_steps", 1000,
                                                                          "--lr_schedule.total_steps", 1000,
                                                                          "--mode", mode)],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not (out / "loss.jsonl").exists() or not (out / "loss.jsonl").read_text().strip():
            assert proc.poll() is None and time.monotonic() < deadline, "the run did not start stepping"
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err[-2000:]
    assert "interrupted (SIGINT)" in err


def test_sigterm_from_another_process_still_ends_the_run_by_sigterm(tiny, tmp_path):
    """The entry point blocks SIGTERM for its relay thread (training/signals.py); a SIGTERM from outside
    still ends the process by SIGTERM (-15, as without the relay), after one line naming the sender."""
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "run_mindformer.py", *args(tiny, out, "--runner_config.max_steps", 1000,
                                                                          "--lr_schedule.total_steps", 1000)],
                            cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not (out / "loss.jsonl").exists() or not (out / "loss.jsonl").read_text().strip():
            assert proc.poll() is None and time.monotonic() < deadline, "the run did not start stepping"
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGTERM, err[-2000:]
    assert f"terminated by SIGTERM from process {os.getpid()}" in err and "interrupted" not in err


def test_checkpoint_library_refuses_nan_and_verifies_checksums(tmp_path):
    from mindformers_core.checkpoint import (CheckpointError, load_checkpoint, newest_intact_step, save_checkpoint,
                                             verify_step)
    d = str(tmp_path / "ckpt")
    w = {"w": np.arange(6, dtype=np.float32).reshape(2, 3)}
    save_checkpoint(d, 1, w, rank=0, world_size=1)
    save_checkpoint(d, 2, {"w": w["w"] + 1}, rank=0, world_size=1)
    with pytest.raises(ValueError, match=r"step 3 holds non-finite values .* \['w'\]; refusing to publish"):
        save_checkpoint(d, 3, {"w": np.full((2, 3), np.inf, np.float32)}, rank=0, world_size=1)
    assert verify_step(d, 2) == [] and newest_intact_step(d) == 2
    shard = tmp_path / "ckpt" / "step_2" / "rank_0.safetensors"
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0x01
    shard.write_bytes(bytes(data))
    assert "corrupt" in str(verify_step(d, 2)[0]) and newest_intact_step(d) == 1
    with pytest.raises(CheckpointError, match="SHA-256 differs"):
        load_checkpoint(d, {"w": ((2, 3), None)}, step=2)
    assert np.array_equal(load_checkpoint(d, {"w": ((2, 3), None)}, step=1)["w"], w["w"])


ASYNC_EVERY_STEP = ["--callbacks", "[{type: MFLossMonitor}, {type: CheckpointMonitor, save_checkpoint_steps: 1, "
                                   "keep_checkpoint_max: 10, async_save: True}]"]


@pytest.fixture(scope="module")
def uninterrupted(tiny, tmp_path_factory):
    """The tiny config's run with a synchronous checkpoint every step, made once for the tests comparing with
    it (read only)."""
    out = tmp_path_factory.mktemp("uninterrupted") / "run"
    assert run_mindformer.main(args(tiny, out, *EVERY_STEP)) == 0
    return out


def test_async_saves_equal_sync_saves_and_resume_exactly(tiny, tmp_path, uninterrupted):
    sync, asyn = uninterrupted, tmp_path / "async"
    assert run_mindformer.main(args(tiny, asyn, *ASYNC_EVERY_STEP, "--runner_config.max_steps", 3)) == 0
    assert steps_in(asyn) == [1, 2, 3]
    for step in (1, 2, 3):
        (ws, os_, ss), (wa, oa, sa) = saved(sync, step), saved(asyn, step)
        assert all(np.array_equal(ws[k], wa[k]) for k in ws) and ss.trainer_state == sa.trainer_state
        assert all(np.array_equal(os_[s][k], oa[s][k]) for s in os_ for k in os_[s])
    assert run_mindformer.main(args(tiny, asyn, *ASYNC_EVERY_STEP, "--resume_training", "True")) == 0
    assert [r["loss"] for r in strict_records(asyn)] == [r["loss"] for r in strict_records(sync)]


def test_a_failing_async_save_is_reported_and_the_previous_step_stays_latest(tiny, tmp_path, monkeypatch, capsys):
    from mindformers_core.checkpoint import read_tracker
    from mindformers_core.checkpoint import save as save_module
    real = save_module.write_safetensors

    def disk_full_at_step_2(path, data):
        if f"{os.sep}step_2.tmp{os.sep}" in path:
            raise OSError(28, "No space left on device")
        return real(path, data)
    monkeypatch.setattr(save_module, "write_safetensors", disk_full_at_step_2)
    out = tmp_path / "run"
    assert run_mindformer.main(args(tiny, out, *ASYNC_EVERY_STEP)) == 0     # training goes on
    assert "async save of step 2 failed on rank 0: OSError: [Errno 28] No space left on device" in \
        capsys.readouterr().out
    assert steps_in(out) == [1, 3, 4] and read_tracker(str(out / "checkpoint")) == 4


def test_one_process_restarts_from_its_checkpoint_with_the_uninterrupted_losses(tiny, tmp_path, uninterrupted):
    whole, restarted = uninterrupted, tmp_path / "restarted"
    env = dict(os.environ, PYTHONPATH=ROOT, MFC_FAULT="exit:0:3", MFC_FAULT_ONCE=str(tmp_path / "fired"))
    res = subprocess.run([sys.executable, "run_mindformer.py", *args(tiny, restarted, *EVERY_STEP),
                          "--runner_config.max_restarts", "1", "--runner_config.heartbeat_timeout", "120"],
                         cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "supervisor: rank 0 died" in res.stderr or "exited with code 43" in res.stderr
    assert "restart 1 of 1 with --resume_training True" in res.stderr
    assert [(r["step"], r["loss"], r["grad_norm"]) for r in strict_records(restarted)] == \
        [(r["step"], r["loss"], r["grad_norm"]) for r in strict_records(whole)]


FINISH = """
import atexit, sys, threading, time
sys.path.insert(0, {root!r})
from mindformers_core.training.cli import finish
atexit.register(lambda: open({marker!r}, "w").write("exit handlers ran"))
threading.Thread(target=time.sleep, args=(60,)).start()     # a non-daemon thread the teardown would wait for
print("output flushed", end="")
finish(3)
"""


@pytest.mark.parametrize("role, teardown", [("MS_WORKER", None), ("MS_WORKER", "1"), ("MS_SCHED", None)])
def test_an_msrun_worker_ends_with_its_code_after_the_exit_handlers(tmp_path, role, teardown):
    """training.cli.finish: an msrun worker flushes, runs the exit handlers and ends without the interpreter's
    teardown (which would wait for the sleeping thread); MFC_WORKER_TEARDOWN=1 and the scheduler keep the teardown
    (told apart here by the thread being waited for: killed at the deadline)."""
    marker = tmp_path / "marker"
    env = {k: v for k, v in os.environ.items() if k not in ("MS_ROLE", "MFC_WORKER_TEARDOWN")}
    env["MS_ROLE"] = role
    if teardown:
        env["MFC_WORKER_TEARDOWN"] = teardown
    quick = role == "MS_WORKER" and not teardown
    try:
        res = subprocess.run([sys.executable, "-c", FINISH.format(root=ROOT, marker=str(marker))], env=env,
                             capture_output=True, text=True, timeout=15 if quick else 4)
        assert quick, "the full teardown did not wait for the non-daemon thread"
        assert res.returncode == 3 and res.stdout == "output flushed", (res.returncode, res.stdout, res.stderr)
        assert marker.read_text() == "exit handlers ran"
    except subprocess.TimeoutExpired:
        assert not quick, "an msrun worker waited in the interpreter's teardown"
