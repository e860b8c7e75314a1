"""The pipeline runtime's settings: ``RuntimeOptions`` read once from the environment (``MFC_PIPELINE_*``),
overridable by argument on ``PipelineStage`` and ``PipelineRuntime``; one run's tables in ``_RunState``."""
import pytest
from mindspore import nn

from mindformers_core import pipeline as pp
from mindformers_core.pipeline import RuntimeOptions
from mindformers_core.pipeline.runtime import PipelineRuntime, PipelineStage
from tests.bodies.pipeline_body import _data, _layers, loss_fn


def test_options_from_the_environment():
    assert RuntimeOptions.from_env({}) == RuntimeOptions()
    got = RuntimeOptions.from_env({"MFC_PIPELINE_RECOMPUTE": "1", "MFC_PIPELINE_SYNC_TRANSFERS": "1",
                                   "MFC_PIPELINE_TRACE": "/tmp/x", "MFC_PIPELINE_TIMEOUT": "12.5",
                                   "MFC_PIPELINE_JIT_CAPTURE": "bytecode"})
    assert got == RuntimeOptions(True, True, "/tmp/x", 12.5, "bytecode") and got.bytecode_capture
    assert RuntimeOptions.from_env({"MFC_PIPELINE_TRACE": "", "MFC_PIPELINE_JIT_CAPTURE": "ast"}) == RuntimeOptions()
    with pytest.raises(ValueError):
        RuntimeOptions.from_env({"MFC_PIPELINE_TIMEOUT": "soon"})


def test_stage_and_runtime_read_the_environment_once_or_take_options(monkeypatch):
    monkeypatch.setenv("MFC_PIPELINE_RECOMPUTE", "1")
    monkeypatch.setenv("MFC_PIPELINE_TIMEOUT", "7")
    from_env = PipelineStage(nn.SequentialCell(_layers()), 0, 1, loss_fn=loss_fn)
    assert from_env.recompute and from_env.options.timeout == 7.0
    monkeypatch.delenv("MFC_PIPELINE_RECOMPUTE")
    assert from_env.recompute   # read when built
    given = PipelineStage(nn.SequentialCell(_layers()), 0, 1, loss_fn=loss_fn, options=RuntimeOptions(recompute=True))
    assert given.recompute
    assert not PipelineStage(nn.SequentialCell(_layers()), 0, 1, loss_fn=loss_fn, recompute=False,
                             options=RuntimeOptions(recompute=True)).recompute
    sched = pp.ScheduleGPipe(given, 2)
    assert sched.runtime("pynative").timeout == 7.0
    runtime = PipelineRuntime(sched, options=RuntimeOptions(timeout=3.0, sync_transfers=True))
    assert (runtime.timeout, runtime.sync_transfers, runtime.trace_file, runtime.record) == (3.0, True, None, False)


def test_a_failed_run_leaves_no_records_behind():
    calls = []

    def failing_loss(out, label):   # the second microbatch of the first run fails
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("planned failure")
        return loss_fn(out, label)
    stage = PipelineStage(nn.SequentialCell(_layers()), 0, 1, loss_fn=failing_loss, options=RuntimeOptions())
    sched = pp.ScheduleGPipe(stage, 2)
    x, y = _data(0)
    with pytest.raises(RuntimeError, match="planned failure"):
        sched.run(x, y)
    loss = sched.run(x, y)   # records the failed run left would break this one
    assert float(loss) > 0 and len(stage.grads) == len(stage.params)
