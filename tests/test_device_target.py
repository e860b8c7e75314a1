"""Which device a job asks for is decided in one place (``distributed.env.requested_device_target``):
``MFC_DEVICE_TARGET`` wins, then the YAML's ``context.device_target``, then MindSpore's context. The
trainer's preflight reads it before any process group exists (bfloat16 is refused on CPU only)."""
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mindspore")
from mindformers_core.distributed.env import requested_device_target  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def test_environment_then_config_then_context(monkeypatch):
    monkeypatch.delenv("MFC_DEVICE_TARGET", raising=False)
    assert requested_device_target() == "CPU"            # MindSpore's context on this machine
    assert requested_device_target("Ascend") == "Ascend"
    monkeypatch.setenv("MFC_DEVICE_TARGET", "GPU")
    assert requested_device_target("Ascend") == "GPU"


@pytest.mark.parametrize("target, refused", [(None, True), ("GPU", False)])
def test_bfloat16_is_refused_before_process_groups_on_cpu_only(target, refused, monkeypatch):
    env = dict(__import__("os").environ)
    env.pop("MFC_DEVICE_TARGET", None)
    if target:
        env["MFC_DEVICE_TARGET"] = target
    run = subprocess.run([sys.executable, str(ROOT / "run_mindformer.py"), "--config", str(ROOT / "configs/llama_tiny.yaml"),
                          "--check_config", "--model.model_config.compute_dtype", "bfloat16"],
                         env=env, capture_output=True, text=True, timeout=120)
    out = run.stdout + run.stderr
    assert ("model.model_config.compute_dtype = 'bfloat16'" in out) is refused, out
    assert (run.returncode != 0) is refused, out
