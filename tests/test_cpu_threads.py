"""The trainer's CPU kernel thread default (``context.cpu_threads`` / ``MFC_CPU_THREADS``): value,
precedence, named errors before any process group, and that MindSpore takes it (in a child process:
MindSpore sets it once per process)."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mindformers_core.training import ConfigError, read_yaml, validate
from mindformers_core.training.cli import CPU_THREADS_ENV, cpu_threads_setting

ROOT = Path(__file__).resolve().parents[1]
RAW = read_yaml(ROOT / "configs" / "llama_tiny.yaml")


def config(*overrides):
    return validate(RAW, list(overrides), worker_num=1)


def test_default_is_cores_shared_by_the_local_workers():
    cfg = config()
    assert cfg.context.cpu_threads is None
    assert cpu_threads_setting(cfg, 1, environ={}, cores=2) == (2, "2 cores // 1 local worker(s)")
    assert cpu_threads_setting(cfg, 2, environ={}, cores=2)[0] == 1
    assert cpu_threads_setting(cfg, 4, environ={}, cores=2)[0] == 1      # never below one
    assert cpu_threads_setting(cfg, 4, environ={}, cores=16)[0] == 4


def test_yaml_key_and_environment_override_in_that_order():
    cfg = config("context.cpu_threads=3")
    assert cpu_threads_setting(cfg, 2, environ={}, cores=2) == (3, "context.cpu_threads")
    assert cpu_threads_setting(cfg, 2, environ={CPU_THREADS_ENV: "5"}, cores=2) == (5, CPU_THREADS_ENV)


@pytest.mark.parametrize("bad", ["0", "-2", "x", "1.5", " 2x"])
def test_bad_environment_value_is_named(bad):
    with pytest.raises(ConfigError) as info:
        cpu_threads_setting(config(), 2, environ={CPU_THREADS_ENV: bad}, cores=2)
    assert info.value.errors == [f"{CPU_THREADS_ENV}={bad!r} (environment): must be a positive integer (CPU "
                                 "kernel threads per worker; unset: cores // local workers = 1)"]


@pytest.mark.parametrize("bad", ["0", "true", "2.5"])
def test_bad_yaml_value_is_named(bad):
    with pytest.raises(ConfigError) as info:
        config(f"context.cpu_threads={bad}")
    assert any(e.startswith(f"context.cpu_threads = ") for e in info.value.errors), info.value.errors


def test_check_config_reports_it_and_names_a_bad_environment_value(tmp_path, capsys, monkeypatch):
    from mindformers_core.training import cli
    argv = ["--config", str(ROOT / "configs" / "llama_tiny.yaml"), "--check_config", "--output_dir",
            str(tmp_path), "--worker_num", "2", "--use_parallel", "True", "--parallel_config.data_parallel", "2"]
    monkeypatch.setenv(CPU_THREADS_ENV, "3")
    assert cli.main(argv) == 0
    assert f"CPU kernel threads per worker: 3 ({CPU_THREADS_ENV})" in capsys.readouterr().out
    monkeypatch.setenv(CPU_THREADS_ENV, "none")
    assert cli.main(argv) == 2
    assert f"{CPU_THREADS_ENV}='none' (environment): must be a positive integer" in capsys.readouterr().err


CHILD = """
import sys
sys.path.insert(0, {root!r})
from mindspore._c_expression import RuntimeConf
from mindformers_core.training import read_yaml, validate
from mindformers_core.training.cli import cpu_threads
cfg = validate(read_yaml({yaml!r}), [], worker_num=1)
assert not RuntimeConf.get_instance().is_op_threads_num_configured()
first = cpu_threads(cfg, 2)
assert RuntimeConf.get_instance().is_op_threads_num_configured()
second = cpu_threads(cfg, 2)
print("RESULT", first.value, first.applied, second.applied, second.describe())
"""


def test_the_value_reaches_mindspore_once_per_process():
    env = {k: v for k, v in os.environ.items() if k != CPU_THREADS_ENV}
    code = CHILD.format(root=str(ROOT), yaml=str(ROOT / "configs" / "llama_tiny.yaml"))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    line = next((ln for ln in out.stdout.splitlines() if ln.startswith("RESULT")), None)
    assert line is not None, out.stdout + out.stderr
    cores = len(os.sched_getaffinity(0))
    assert line.startswith(f"RESULT {max(1, cores // 2)} True False CPU kernel threads already set"), line
