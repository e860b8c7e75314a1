"""``hsdp(cell, ...)``: ZeRO level1/2/3 over the data-parallel domain, in PyNative and ``ms.jit``.

::

    wrapped = hsdp(model, shard_size=2, threshold=64, optimizer_level="level2")
    opt = AdamW(wrapped.trainable_params(), learning_rate=1e-3)
    step = wrapped.train_step(loss_fn, opt, mode="jit")   # shards opt's states
    for x, y in batches:                                  # this rank's slice of the global batch
        loss = step(x, y)                                 # global-batch mean loss

The entry point only: a Cell becomes an ``HSDPCell`` (``cell.py``), pipeline stages an
``HSDPStages`` (``pipeline.py``). See ``plan.py`` for how ranks and parameters are split,
``step.py`` for the step's Cells and docs/hsdp.md for the whole story.
"""
from __future__ import annotations

from typing import Optional, Sequence

from mindspore import nn

from . import plan as P
from .cell import HSDPCell
from .groups import dp_ranks
from .pipeline import hsdp_stages, is_stage


def hsdp(cell, shard_size: int = 1, threshold: float = 64, optimizer_level: str = "level1",
         accumulate_grad_step: int = 1, dp_group=None, units: Optional[Sequence[str]] = None) -> "HSDPCell":
    """Wrap ``cell`` for hybrid sharded data parallel (see the module docstring).

    ``shard_size``: data-parallel ranks sharing one copy of the sharded state (1 = pure data
    parallel, -1 or the dp size = full ZeRO; in between, shard inside groups of ``shard_size``
    consecutive dp ranks and replicate across them). ``threshold``: parameters smaller than this
    many KB stay unsharded. ``optimizer_level``: ``level1`` shards optimizer states, ``level2``
    also gradients, ``level3`` also parameters. ``accumulate_grad_step``: micro-steps per
    optimizer step (gradients averaged; communication on the last micro-step only).
    ``units`` (level3): Cell-name patterns (``"decoder.layers.*"``) whose sharded parameters are
    gathered together right before the Cell's forward and again before its backward, and freed
    right after each; parameters outside them are gathered by the Cell that owns them (the
    default for all: one unit per owning Cell). See ``hsdp/units.py``.
    ``cell`` may also be a pipeline stage (``PipelineStage``) or the list of this rank's stages:
    each stage is then sharded over its own data-parallel group and ``train_step`` takes the
    schedule (see ``hsdp/pipeline.py``; level1/2/3 supported, ``accumulate_grad_step`` must be 1).
    ``dp_group``: ProcessGroup or rank list; default: the "dp" axis of the sharding plan when
    ``cell`` was sharded by ``parallelize`` (tensor parallel composes: hsdp shards the local
    tensor-parallel shards along dp), else parallel_state's data(-context)-parallel group if
    initialized, else the world. Bad arguments raise ValueError before any group exists.
    """
    if is_stage(cell) or (isinstance(cell, (list, tuple)) and cell and all(is_stage(c) for c in cell)):
        _check_units(units, optimizer_level)
        return hsdp_stages(cell, shard_size, threshold, optimizer_level, accumulate_grad_step, dp_group, units)
    if not isinstance(cell, nn.Cell):
        raise TypeError(f"hsdp: cell must be a mindspore.nn.Cell, a pipeline stage (PipelineStage) or a "
                        f"list of this rank's stages, got {type(cell).__name__}")
    ranks = dp_ranks(dp_group, cell)
    size = P.check_hsdp_arguments(shard_size, threshold, optimizer_level, accumulate_grad_step, len(ranks))
    _check_units(units, optimizer_level)
    return HSDPCell(cell, ranks, size, float(threshold), optimizer_level, accumulate_grad_step, units=units)


def _check_units(units, optimizer_level) -> None:
    if units is None:
        return
    if isinstance(units, str) or not all(isinstance(u, str) for u in units):
        raise ValueError(f"hsdp: units={units!r} must be a list of Cell-name patterns, e.g. ['decoder.layers.*']")
    if optimizer_level != "level3":
        raise ValueError(f"hsdp: units={list(units)} only apply to optimizer_level='level3' "
                         f"(got {optimizer_level!r}): only level3 gathers parameters")
