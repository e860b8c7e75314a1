"""What a pip user gets: a wheel built from this tree, installed into a fresh venv outside the
checkout, trains the tiny config for 2 steps from a directory that is not the repository, through
``python -m mindformers_core.run`` and the ``mindformers-run`` console script.

The fresh venv gets no downloads: the wheel is installed ``--no-deps`` and the dependencies
(MindSpore, NumPy, ...) are made visible by a ``.pth`` file holding the project venv's
site-packages path as a plain line (so that directory's own ``.pth`` files, the editable install of
this checkout among them, are not run).
"""
import json
import os
import shutil
import site
import subprocess
import sys
import sysconfig
import zipfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = 2
OVERRIDES = ["--runner_config.max_steps", str(STEPS), "--lr_schedule.total_steps", str(STEPS),
             "--model.model_config.num_layers", "2", "--model.model_config.hidden_size", "64",
             "--model.model_config.ffn_hidden_size", "128", "--model.model_config.seq_length", "32",
             "--model.model_config.vocab_size", "384"]


def _run(cmd, cwd, timeout=600):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    out = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, f"{cmd} exited {out.returncode}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out.stdout


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(wheel path, fresh venv's python) with the wheel installed."""
    base = tmp_path_factory.mktemp("wheel")
    src = base / "src"                                  # build from a copy: the checkout stays untouched
    shutil.copytree(os.path.join(ROOT, "mindformers_core"), src / "mindformers_core",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for name in ("setup.py", "README.md"):
        shutil.copy(os.path.join(ROOT, name), src / name)
    _run([sys.executable, "-m", "pip", "wheel", ".", "--no-deps", "--no-build-isolation", "--no-index",
          "-q", "-w", str(base / "dist")], cwd=src)
    (wheel,) = (base / "dist").glob("mindformers_core-*.whl")
    venv = base / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], cwd=base)
    python = venv / "bin" / "python"
    _run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)], cwd=base)
    purelib = _run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], cwd=base)
    deps = sysconfig.get_paths()["purelib"]              # the project venv's site-packages
    with open(os.path.join(purelib.strip(), "project_dependencies.pth"), "w") as f:
        f.write(deps + "\n")
    return wheel, python, base


def test_the_wheel_holds_the_package_and_nothing_else(installed):
    wheel, _, _ = installed
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith((".dist-info", ".data"))}
    assert top == {"mindformers_core"}, top             # no research/, tests/, bench/, scripts/
    packages = {os.path.dirname(p) for p in names if p.endswith("/__init__.py")}
    for dirpath, dirnames, filenames in os.walk(os.path.join(ROOT, "mindformers_core")):
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        rel = os.path.relpath(dirpath, ROOT)
        if "__init__.py" in filenames:
            assert rel in packages, f"{rel} is a package of the tree but not in the wheel"
            for f in filenames:
                if f.endswith(".py"):
                    assert f"{rel}/{f}" in names, f"{rel}/{f} missing from the wheel"
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert "mindformers-run = mindformers_core.run:main" in zipfile.ZipFile(wheel).read(entry_points).decode()


def test_the_fresh_venv_imports_the_installed_copy(installed):
    _, python, base = installed
    out = _run([str(python), "-c", "import mindformers_core, mindspore; print(mindformers_core.__file__)"],
               cwd=base)
    where = out.strip().splitlines()[-1]
    assert where.startswith(str(base / "venv")), where
    assert not where.startswith(ROOT)


def _train(cmd, base, name):
    work = base / name                                 # not the repository: nothing of the checkout here
    work.mkdir()
    shutil.copy(os.path.join(ROOT, "configs", "llama_tiny.yaml"), work / "llama_tiny.yaml")
    out = work / "out"
    _run([*cmd, "--config", "llama_tiny.yaml", "--output_dir", str(out), *OVERRIDES], cwd=work)
    with open(out / "loss.jsonl") as f:
        losses = [json.loads(line) for line in f]
    assert len(losses) == STEPS, losses


def test_python_m_mindformers_core_run_trains(installed):
    _, python, base = installed
    _train([str(python), "-m", "mindformers_core.run"], base, "run_module")


def test_the_console_script_trains(installed):
    _, python, base = installed
    _train([str(python.parent / "mindformers-run")], base, "console_script")
