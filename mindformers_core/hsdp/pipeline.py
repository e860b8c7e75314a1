"""hsdp over pipeline stages: ZeRO level1/2/3 of each stage over that stage's data-parallel group.

::

    stage = PipelineStage(model, s, pp, pp_ranks=pp_ranks, loss_fn=loss_fn, dp_group=dp_group)
    sched = Schedule1F1B(stage, micro_batch_num=4)
    wrapped = hsdp(stage, shard_size=-1, optimizer_level="level2")   # or hsdp([stage_a, stage_b])
    opt = AdamW(wrapped.trainable_params(), 1e-3)
    step = wrapped.train_step(sched, opt, mode="jit", max_grad_norm=1.0)
    loss = step(inputs, labels)      # the global-batch loss on the last stage's ranks, else None

One step: the schedule runs every microbatch (level3: each unit of a stage gathers its weights
around its forward, recomputed forward and backward, see ``units.py``), the runtime summing weight gradients locally (no data-parallel
communication per microbatch: hsdp calls ``stage.delegate_dp_reduction(wrapped)`` so the runtime's
all-reduce over ``stage.dp_group`` is skipped); then once: the gradients are reduced over the stage's dp group
(level1: all-reduce; level2/3: reduce-scatter over the shard group + all-reduce over the
replicas), optionally clipped by the global norm over every pipeline stage, and the optimizer
updates this rank's shards (``cell.hsdp_update``: the same reduce -> clip -> guard -> update as
``HsdpTrainStep``) (level1/2 all-gather them into the full parameters; level3 updates
the shards in place).

Nothing here imports the pipeline package (same layer): stages are used through their public
attributes (``cell``, ``params``, ``grads``, ``dp_group``, ``pp_ranks``, ``stage_index``, ``stage_num``,
``weight_shapes``, ``compiled_inside``) and ``delegate_dp_reduction``, the schedule through
``run`` / ``runtime`` (see ``PipelineStage``'s docstring).
"""
from __future__ import annotations

from typing import List, Optional, Sequence

import numpy as np
import mindspore as ms
from mindspore import Tensor, nn

from ..common.graphs import compile_blocking
from ..distributed.env import get_env
from ..distributed.process_group import ProcessGroup, new_group
from . import plan as P
from .cell import HSDPCell, hsdp_update
from .groups import dp_ranks, plan_dp_ranks

STAGE_ATTRS = ("cell", "params", "stage_index", "stage_num", "dp_group")


def is_stage(obj) -> bool:
    """True for a pipeline stage object (``pipeline.runtime.PipelineStage``)."""
    return not isinstance(obj, nn.Cell) and all(hasattr(obj, a) for a in STAGE_ATTRS)


def _ranks_of(group) -> Optional[List[int]]:
    if group is None:
        return None
    if isinstance(group, ProcessGroup) or hasattr(group, "ranks"):
        return [int(r) for r in group.ranks]
    return [int(r) for r in group]


def stage_dp_ranks(stages: Sequence, dp_group=None, rank: Optional[int] = None,
                   world_size: Optional[int] = None) -> List[int]:
    """The data-parallel ranks of this rank's ``stages``, without creating any group.

    In order of preference: ``dp_group``; the stages' ``dp_group`` (they must agree); the "dp"
    axis of the sharding plan of stage Cells sharded by ``parallelize``; parallel_state's
    data-parallel group; ``[rank]`` when the pipeline is the whole world (no data parallel).
    Checked: ``rank`` is in the group and no other rank of its pipeline (``pp_ranks``) is.
    """
    env = get_env() if rank is None or world_size is None else None
    rank = env.rank if rank is None else rank
    world_size = env.world_size if world_size is None else world_size
    first = stages[0]
    pp_ranks = list(first.pp_ranks) if getattr(first, "pp_ranks", None) is not None \
        else list(range(world_size))
    if dp_group is not None:
        ranks = dp_ranks(dp_group)
    else:
        candidates = [(f"stage {st.stage_index}'s dp_group", _ranks_of(st.dp_group)) for st in stages]
        if all(r is None for _, r in candidates):
            candidates = [(f"stage {st.stage_index}'s sharding plan (dp axis)", plan_dp_ranks(st.cell))
                          for st in stages]
        found = [(what, r) for what, r in candidates if r is not None]
        if found:
            if any(r != found[0][1] for _, r in found) or len(found) != len(stages):
                raise ValueError("hsdp: this rank's stages disagree on their data-parallel group: " +
                                 "; ".join(f"{what} = {r}" for what, r in candidates) +
                                 "; every stage of a rank must be replicated over the same ranks "
                                 "(or pass dp_group)")
            ranks = found[0][1]
        else:
            from ..distributed import parallel_state
            if parallel_state.model_parallel_is_initialized():
                ranks = list(parallel_state.get_data_parallel_group(with_context_parallel=True).ranks)
            elif len(pp_ranks) == world_size:
                ranks = [rank]   # the pipeline is the whole world: no data parallel
            else:
                raise ValueError(f"hsdp: cannot tell the data-parallel group of stage(s) "
                                 f"{[st.stage_index for st in stages]}: their dp_group is None, they were "
                                 f"not sharded by parallelize, parallel_state is not initialized, and the "
                                 f"pipeline pp_ranks={pp_ranks} is not the whole world of {world_size} "
                                 "ranks; pass dp_group (the ranks holding the same stage)")
    return P.check_stage_dp_ranks(ranks, pp_ranks, rank)


def hsdp_stages(stages, shard_size: int = 1, threshold: float = 64, optimizer_level: str = "level1",
                accumulate_grad_step: int = 1, dp_group=None, units=None) -> "HSDPStages":
    """``hsdp`` for a pipeline stage or the list of this rank's stages (what ``hsdp`` calls when
    given stages). Arguments as for ``hsdp``; ``shard_size`` must divide the stages' dp size,
    ``accumulate_grad_step`` must be 1 (the schedule already accumulates its microbatches)."""
    stages = list(stages) if isinstance(stages, (list, tuple)) else [stages]
    if not stages or not all(is_stage(st) for st in stages):
        bad = [type(st).__name__ for st in stages if not is_stage(st)]
        raise TypeError(f"hsdp: expected a pipeline stage or a non-empty list of this rank's stages "
                        f"(PipelineStage), got {bad or 'an empty list'}")
    if len({st.stage_index for st in stages}) != len(stages):
        raise ValueError(f"hsdp: stages {[st.stage_index for st in stages]} repeat a stage index")
    if accumulate_grad_step != 1:
        raise ValueError(f"hsdp: accumulate_grad_step={accumulate_grad_step!r} is not supported with "
                         "pipeline stages (valid: 1); the schedule already sums the gradients of its "
                         "micro_batch_num microbatches before hsdp reduces them once: raise micro_batch_num")
    ranks = stage_dp_ranks(stages, dp_group)
    size = P.check_hsdp_arguments(shard_size, threshold, optimizer_level, accumulate_grad_step, len(ranks))
    return HSDPStages(stages, ranks, size, float(threshold), optimizer_level, units)


class _StageCells(nn.Cell):
    """Holds the stages' Cells without renaming their parameters (no prefix)."""

    def __init__(self, cells):
        super().__init__(auto_prefix=False)
        for i, c in enumerate(cells):
            setattr(self, f"stage{i}", c)


class HSDPStages(HSDPCell):
    """hsdp over this rank's pipeline stages (see the module docstring). The whole ``HSDPCell``
    API applies (``describe``, ``trainable_params``, ``unsharded``, ``gather_full_params``,
    ``shard_optimizer``, ``collective_count``); ``train_step`` takes the schedule."""


    def __init__(self, stages: Sequence, dp_ranks: Sequence[int], shard_size: int, threshold: float,
                 level: str, units: Optional[Sequence[str]] = None):
        object.__setattr__(self, "stages", sorted(stages, key=lambda st: st.stage_index))
        super().__init__(_StageCells([st.cell for st in self.stages]), dp_ranks, shard_size, threshold,
                         level, 1, units=units)
        for st in self.stages:
            st.delegate_dp_reduction(self)   # the runtime no longer all-reduces over st.dp_group
            if self.units is not None:   # level3: shards outside the units; gradients are full-sized
                st.weight_shapes = tuple(self.plans[id(p)].shape for p in st.params)

    def construct(self, *args, **kwargs):
        raise TypeError("hsdp over pipeline stages: the schedule runs the stages; use "
                        "wrapped.train_step(schedule, optimizer)(inputs, labels)")

    def train_step(self, schedule, optimizer, mode: str = "pynative", max_grad_norm: Optional[float] = None,
                   norm_groups: Sequence = (), norm_weights: Optional[Sequence[float]] = None,
                   step_guard=None) -> "PipelineTrainStep":
        """A callable ``step(inputs=None, labels=None, config=None) -> loss`` running one schedule
        step and one optimizer step (see ``PipelineTrainStep``)."""
        return PipelineTrainStep(self, schedule, optimizer, mode, max_grad_norm, norm_groups, norm_weights, step_guard)


class PipelineTrainStep:
    """``step(inputs, labels, config=None)``: ``schedule.run`` (the rank of stage 0 passes
    ``inputs``, the rank of the last stage ``labels``: this replica's slice of the global batch),
    then the data-parallel reduction, clipping and optimizer step. Returns the loss averaged over
    the microbatches and the dp group on the last stage's ranks, None elsewhere.

    ``max_grad_norm`` clips by the global norm of every stage's gradient: summed over the hsdp
    shard group (sharded pieces count once, replicated ones ``1/shard_size``) and over the
    pipeline group (each stage's parameters live on one pipeline rank); ``norm_groups`` /
    ``norm_weights`` add tensor parallelism as for ``HSDPCell.train_step``. ``grad_norm`` holds the
    last step's norm (before clipping). ``mode="jit"`` runs the stages' compiled functions and
    compiles the reduce/clip/update step; parameters are passed to the graphs as arguments, so
    level3's eager gather/shrink around the step is seen by them. ``step_guard`` as for
    ``HSDPCell.train_step``.
    """

    def __init__(self, wrapped: HSDPStages, schedule, optimizer, mode: str = "pynative",
                 max_grad_norm: Optional[float] = None, norm_groups: Sequence = (),
                 norm_weights: Optional[Sequence[float]] = None, step_guard=None):
        if mode not in ("pynative", "jit"):
            raise ValueError(f"train_step: mode={mode!r}; valid modes are 'pynative' and 'jit'")
        if not (hasattr(schedule, "run") and hasattr(schedule, "stages")):
            raise TypeError(f"train_step: schedule must be a pipeline schedule built on the wrapped "
                            f"stages, got {type(schedule).__name__}")
        mine = sorted(st.stage_index for st in wrapped.stages)
        theirs = sorted(st.stage_index for st in schedule.stages)
        if mine != theirs or any(a is not b for a, b in zip(
                sorted(wrapped.stages, key=lambda s: s.stage_index),
                sorted(schedule.stages, key=lambda s: s.stage_index))):
            raise ValueError(f"train_step: the schedule runs stages {theirs} but hsdp wraps stages {mine}; "
                             "build the schedule from the same PipelineStage objects")
        self.wrapped, self.schedule, self.mode = wrapped, schedule, mode
        wrapped.optimizer_plans(optimizer)   # checks the optimizer first
        self.params = tuple(optimizer.parameters)
        where = {}
        for si, st in enumerate(wrapped.stages):
            for j, p in enumerate(st.params):
                where[id(p)] = (si, j)
        self.source = tuple(where[id(p)] for p in self.params)
        self.has_last = any(st.stage_index == st.stage_num - 1 for st in wrapped.stages)
        self.units = wrapped.units
        if self.units is not None and mode == "jit":   # before the runtime exists: it reads compiled_inside
            self.units.make_islands()
            for st in wrapped.stages:
                st.compiled_inside = True

        def pipeline_groups():   # each stage's parameters live on one pipeline rank: norms summed over pp too
            pp_ranks = schedule.runtime(mode).pp_ranks
            return [new_group(pp_ranks)] if len(pp_ranks) > 1 else []
        # stages sharded by ``parallelize`` over a dp axis return the global loss and give
        # dp-partial gradients (sum them); replicated stages give local ones (average them)
        self.update = update = hsdp_update(wrapped, optimizer, max_grad_norm, norm_groups, norm_weights, step_guard,
                                           pipeline_groups=pipeline_groups)
        self.grad_norm = None
        self._zero_loss = Tensor(np.zeros((), np.float32))

        def reduce_and_update(grads, loss, *params):   # the parameters as arguments: read at every call
            return update(grads, loss)

        self.fn = compile_blocking(reduce_and_update) if mode == "jit" else reduce_and_update

    def __call__(self, inputs=None, labels=None, config=None, microbatches=None):
        """``microbatches``: ``(xs, ys, side)`` already split (``schedule.run_microbatches``: per-microbatch inputs,
        labels and side inputs every stage takes, e.g. a packed row's positions and documents) instead of
        ``inputs`` / ``labels`` split by ``config``."""
        wrapped = self.wrapped
        if self.units is not None and wrapped.holds_full_params:
            raise RuntimeError("hsdp level3: the train step runs on the shards (each unit gathers its own "
                               "weights); call it outside `with wrapped.unsharded():`")
        if microbatches is not None:
            xs, ys, side = microbatches
            loss = self.schedule.run_microbatches(xs, ys, mode=self.mode, side=side)
        else:
            loss = self.schedule.run(inputs, labels, mode=self.mode, config=config)
        made = loss
        if self.units is not None:
            self.units.check_closed()
        grads = tuple(wrapped.stages[si].grads[j] for si, j in self.source)
        local = loss if loss is not None else self._zero_loss
        if self.mode == "jit":   # a plain tuple of Tensors is a constant to ms.jit: recompiled per call
            grads = ms.mutable(grads)
        loss, norm, _ = self.fn(grads, local, *self.params)
        self.grad_norm = norm if self.update.clip is not None else None
        # a rank without the last stage returns the stage-local losses its stages made (e.g. a MoE
        # stage's load-balancing loss), reduced over dp as the last stage's loss is; None when it made none
        return loss if self.has_last or made is not None else None
