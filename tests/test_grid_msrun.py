"""The suite's share of the feature grid (mindformers_core/testing/grid.py, docs/finetune.md "Feature grid"): a fixed
subset of its cells, chosen so that every feature (full, LoRA), every model (Qwen3, Qwen3-MoE, DeepSeek-V3 with MTP),
both data kinds (packed SFT rows, plain rows) and every layout (tp2 + SP, dp2, cp2 ring, cp2 Ulysses, pp2 1F1B, pp2
DualPipeV, ep2, dp2 + hsdp level3) runs at least once in each mode. (Refused cells are found by the preflight
before any worker starts: tests/test_grid.py; which cells are refused today is the table in docs/finetune.md.)

Each cell is the user's path: its YAML through the trainer's command line on 2 workers with ``--export_hf_dir``,
compared with the one-process run of the same YAML with parallel sizes 1 (computed here, once per feature, model,
data and mode): the loss of every step and every tensor of the export (LoRA: merged) within 1e-5 relative.

The cells run in turn in one job of the suite's batched 2-worker launch (``grid.run_cells``; tests/msrun_batch.py);
the references are computed ahead, in this process. ``python scripts/check_grid.py`` runs the whole grid."""
import functools
import os
import tempfile

import pytest

from mindformers_core.testing import grid
from tests.msrun_batch import computed_ahead, job

pytestmark = pytest.mark.msrun


def _cell(name):
    feature, model, data, layout, mode = name.split("-")
    return grid.Cell(feature, model, data, layout, mode)


SUBSET = [
    # PyNative
    "full-qwen3_moe-packed-tp2_sp-pynative",
    "lora-qwen3-plain-dp2-pynative",
    "lora-qwen3-packed-cp2_ring-pynative",
    "full-deepseek_v3-packed-cp2_ulysses-pynative",     # MTP with packed rows under context parallel
    "full-deepseek_v3-plain-pp2_1f1b-pynative",
    "lora-deepseek_v3-plain-pp2_dualpipev-pynative",   # the fixture with its MTP layer added (grid.with_mtp_layer)
    "lora-qwen3_moe-packed-ep2-pynative",
    "full-deepseek_v3-packed-dp2_hsdp3-pynative",
    # jit (the cheapest compiles of each kind: Qwen3 where any model shows the layout, but for tp2+SP)
    "lora-qwen3_moe-plain-tp2_sp-jit",     # adapters beside the MoE router's counters (comm.kernels.FreshCopy)
    "lora-qwen3-packed-dp2-jit",
    "full-qwen3-packed-cp2_ring-jit",
    "full-qwen3-packed-cp2_ulysses-jit",
    "full-qwen3-packed-dp2_hsdp3-jit",
    "full-qwen3-plain-pp2_dualpipev-jit",
    "full-qwen3_moe-packed-ep2-jit",
    "full-deepseek_v3-packed-pp2_1f1b-jit",
]
CELLS = [_cell(n) for n in SUBSET]


@functools.lru_cache(maxsize=None)
def plan():
    """The YAMLs (and the corpus) in a work folder, the preflight's refusals, the workers' cells (once per process)."""
    work = tempfile.mkdtemp(prefix="grid_msrun_")
    refused, launched, refs = grid.prepare(CELLS, work)
    specs = [[name, grid.argv_of(path, os.path.join(work, "out", name))] for name, path in launched.items()]
    return work, refused, launched, refs, specs


TWO = job("grid_subset", 2, "mindformers_core.testing.grid:run_cells",
          lambda: {"cells": plan()[4], "results_dir": os.path.join(plan()[0], "cells")}, timeout=1200, group=__name__)


@computed_ahead
def one_process():
    """The one-process references of the launched cells, in this process."""
    work, _, _, refs, _ = plan()
    return {name: grid.run_reference(name, path, work) for name, path in refs.items()}


@pytest.fixture(scope="module")
def runs():
    errors = one_process()
    results = TWO.results()
    return plan()[0], errors, results


def test_the_subset_covers_every_feature_model_data_and_layout_in_each_mode():
    ran = CELLS
    for mode in grid.MODES:
        here = [c for c in ran if c.mode == mode]
        assert {c.feature for c in here} == set(grid.FEATURES), mode
        assert {c.model for c in here} == set(grid.MODELS), mode
        assert {c.data for c in here} == set(grid.DATA), mode
        assert {c.layout for c in here} == set(grid.LAYOUTS), mode


def test_no_cell_of_the_subset_is_refused():
    _, refused, _, _, _ = plan()
    assert not refused, refused


@pytest.mark.parametrize("name", SUBSET)
def test_cell_equals_one_process(runs, name):
    work, errors, results = runs
    cell = _cell(name)
    assert errors[cell.reference] is None, errors[cell.reference]
    assert [r[name]["code"] for r in results] == [0, 0]
    assert not any(r[name].get("recompiled") for r in results), results[0][name].get("recompiled")
    why, detail = grid.compare(os.path.join(work, "out", name), os.path.join(work, "out", cell.reference))
    assert why is None, why
    assert detail["loss"] <= grid.RTOL and detail["weights"] <= grid.RTOL
