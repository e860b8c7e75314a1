"""Every ```python block of README.md and docs/*.md runs, so a doc example cannot rot.

One-process blocks are executed here, in-process (MindSpore is imported once), each in a fresh
namespace and a fresh temporary working directory. Blocks marked ``# msrun: N workers`` run on N
msrun workers, all blocks of one worker count in one launch (tests/msrun_batch.py). A block that is
only an outline (signatures, YAML, shell) must be fenced as ``text``/``yaml``/``bash``, not ``python``.
"""
import os

import pytest

from tests.doc_blocks import ROOT, all_blocks, doc_files
from tests.msrun_batch import job

BLOCKS = all_blocks()
ONE_PROCESS = [b for b in BLOCKS if b.nproc is None]
MSRUN = [b for b in BLOCKS if b.nproc is not None]
JOBS = {b.id: job(f"docs {b.id}", b.nproc, "tests.bodies.docs_body:run_block",
                  {"block_id": b.id, "source": b.source}, timeout=300, group=__name__) for b in MSRUN}


def test_every_doc_file_is_scanned_and_has_runnable_blocks():
    assert "README.md" in doc_files() and len(doc_files()) > 10
    assert ONE_PROCESS and MSRUN
    for block in BLOCKS:     # a python block must at least compile: outlines belong in ```text
        compile(block.source, block.id, "exec")


@pytest.mark.parametrize("block", ONE_PROCESS, ids=lambda b: b.id)
def test_one_process_block_runs(block, tmp_path, monkeypatch):
    from tests.bodies.docs_body import run_block
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    run_block(block.id, block.source)


@pytest.mark.msrun
@pytest.mark.parametrize("block", MSRUN, ids=lambda b: f"{b.id}[{b.nproc}w]")
def test_msrun_block_runs(block, record_property):
    from tests.msrun_batch import BATCH
    results = JOBS[block.id].results()
    assert len(results) == block.nproc
    record_property("block_seconds", BATCH.seconds.get(JOBS[block.id].name))   # its share of the launch
    print(f"{block.id}: {BATCH.seconds.get(JOBS[block.id].name)} s on {block.nproc} workers")


def test_readme_layout_lists_every_package_at_its_level():
    """README's Layout section names each subpackage with the level tests/test_layering.py enforces."""
    import re
    from tests.test_layering import LAYERS
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    layout = readme[readme.index("## Layout"):]
    listed = {name: int(level) for level, name in re.findall(r"^(\d+)\s+mindformers_core/(\w+)/", layout, re.M)}
    packages = {d for d in os.listdir(os.path.join(ROOT, "mindformers_core"))
                if os.path.isfile(os.path.join(ROOT, "mindformers_core", d, "__init__.py"))}
    assert packages <= set(listed), f"README Layout misses {sorted(packages - set(listed))}"
    assert listed == {name: LAYERS[name] for name in listed}, "README Layout levels differ from test_layering"


def test_readme_feature_table_points_at_what_exists():
    """Each row's module column names importable mindformers_core modules (or a repository
    folder) and each docs link names an existing file."""
    import importlib
    import re
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    rows = [line.split(" | ") for line in readme.splitlines() if line.startswith("| ") and "---" not in line]
    problems = []
    for cells in rows[1:]:                       # rows[0] is the header
        for name in re.findall(r"`([^`]+)`", cells[1]):
            if "/" in name:                      # a repository folder: scripts/, research/llama
                if not os.path.exists(os.path.join(ROOT, name)):
                    problems.append(f"folder {name}")
                continue
            try:
                importlib.import_module(f"mindformers_core.{name}")
            except ImportError:
                problems.append(f"module mindformers_core.{name}")
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", readme):
        if "://" not in target and not os.path.exists(os.path.join(ROOT, target)):
            problems.append(f"link {target}")
    assert not problems, f"README points at what does not exist: {problems}"
