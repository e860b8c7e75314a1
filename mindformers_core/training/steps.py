"""One training step ``(ids, labels) -> (loss, grad_norm)`` for every combination the trainer runs.

A step is built from three choices:

* where gradients come from: one ``value_and_grad`` of the model, or a pipeline schedule run over
  this rank's stages (the last stage's loss shared with every pipeline rank for logging);
* who reduces, clips and updates: our ``GradientReducer`` + ``ClipGradNorm`` + ``AdamW``, or hsdp
  (``parallel.enable_parallel_optimizer``: ZeRO over the data-parallel axis, which also owns
  accumulation and clipping);
* how many micro-steps: ``gradient_accumulation_steps`` slices of the local batch, gradients summed
  and their mean applied once (the same update as one batch of all rows).

Under jit (``context.mode: 0``) the plain step is one compiled graph; with accumulation or a
pipeline, the gradient function and the update are compiled and driven by a Python loop.
"""
from __future__ import annotations

import fnmatch
import math
from dataclasses import dataclass
from typing import Callable, Iterator, List, Optional, Tuple

import mindspore as ms

from ..common.graphs import compile_blocking
from ..optim import AdamW, ClipGradNorm, StepGuard, build_lr_schedule, replication_weights
from ..pipeline.schedules import build_schedule
from ..sharding.parallelizer import GradientReducer
from .config import Config, ConfigError
from .model_builder import BuiltModel
from .shape import JobShape
from .topology import Topology


@dataclass
class TrainStep:
    step_fn: Callable            # (ids, labels) -> (loss, grad_norm); grad_norm None when nothing needs it
    optimizer: AdamW
    lr: object                   # the lr schedule (``lr.at(step)``)
    wrapped: Optional[object]    # the hsdp wrapper, when hsdp owns the update
    guard: Optional[StepGuard] = None   # the bad-step guard the update applies (None: every step updates)
    poison: Optional[object] = None     # MFC_FAULT "nan": a Parameter multiplied into the gradients (1 or NaN)


def clip_limit(max_grad_norm: float) -> float:
    """``runner_config.max_grad_norm`` as a clipping limit: 0 means no clipping, i.e. an infinite
    limit (the norm is still computed and logged)."""
    return max_grad_norm if max_grad_norm > 0 else math.inf


def micro_slices(ids, labels, k: int) -> Iterator[Tuple[object, object]]:
    """The ``k`` equal row slices of a local batch, in order (gradient-accumulation micro-steps)."""
    rows = ids.shape[0] // k
    for i in range(k):
        yield ids[i * rows:(i + 1) * rows], labels[i * rows:(i + 1) * rows]


def build_lr(cfg: Config, total_steps: int):
    oc, lc = cfg.optimizer, cfg.lr_schedule
    total = int(lc.total_steps) if int(lc.total_steps) > 0 else total_steps
    warmup = int(lc.warmup_steps) if lc.warmup_steps is not None else int(round(float(lc.warmup_ratio) * total))
    peak = float(lc.learning_rate if lc.learning_rate is not None else oc.learning_rate)
    try:
        return build_lr_schedule(lc.type, peak, warmup, total, float(lc.lr_end))
    except ValueError as e:
        raise ConfigError([f"lr_schedule = {lc.type} with warmup {warmup} of {total} steps: {e}"]) from None


def norm_needed(cfg: Config, limit: float, guard: Optional[StepGuard]) -> bool:
    """Whether a step computes the global gradient norm: for clipping, for the bad-step guard, or for the
    log (``runner_config.log_grad_norm``). Skipping it saves a pass over every gradient and, with tp/ep/pp,
    an all-reduce: 0.04-0.07 s of a 0.6 s jit step of the bench Llama (docs/pipeline.md "Measured")."""
    return limit != math.inf or guard is not None or bool(cfg.runner_config.log_grad_norm)


def build_guard(cfg: Config) -> Optional[StepGuard]:
    """``runner_config.use_skip_step_on_nan`` / ``global_norm_skip_threshold`` as a StepGuard."""
    rc = cfg.runner_config
    threshold = rc.get("global_norm_skip_threshold")
    guard = StepGuard(bool(rc.get("use_skip_step_on_nan", True)), None if threshold is None else float(threshold))
    return guard if guard.enabled else None


_TINY_GRAPH = None


def _tiny(x):
    return x * 2 + 1


def relax_actor_threads() -> None:
    """Launch one tiny compiled graph (``x * 2 + 1`` on 4 floats, ~1 ms) so that MindSpore's actor threads
    stop spinning when idle. The PyNative trainer calls it before its first step and after every step.

    Why (MindSpore 2.10 on CPU, measured with bench/eager_state.py, docs/pipeline.md "The slow eager
    state"): ``ActorMgr::Initialize`` (core/mindrt/src/actor/actormgr.cc) sets the actor thread pool's
    spin count to ``kDefaultSpinCount`` = 300000 (``SetSpinCountMaxValue``): an idle ``ActorThread``
    calls ``sched_yield`` up to 300000 times before it sleeps (``ActorWorker::RunWithSpin``,
    core/mindrt/src/thread/actor_threadpool.cc). Only ``GraphScheduler::Run`` sets it back to 1
    (``SetSpinCountMinValue``, after every graph launch); eager ops never do. So a process that has run
    no graph spins between its eager ops, on 2 cores against the Python thread and the op queues: the
    bench Llama's step took 2.2-2.5 s with 1.2-1.8 s of system time (ActorThread_0 0.55-0.89 s of it,
    ~1M involuntary context switches per step), and 1.35-1.5 s with ActorThread_0 at 0.00-0.06 s of
    system time after one such launch. Plain MindSpore launches a graph every step
    (``nn.AdamWeightDecay.construct`` is ``@jit``). No model value is touched.

    The graph launch also runs MindSpore's ``SignalGuard`` (its own SIGINT handler, which sends SIGTERM):
    the command line takes SIGINT itself (training/signals.py), so Ctrl-C still exits 130 there; a
    program that calls the trainer as a library gets MindSpore's handling of Ctrl-C (as under jit)."""
    global _TINY_GRAPH
    if _TINY_GRAPH is None:
        _TINY_GRAPH = (ms.jit(_tiny), ms.Tensor([0.0, 1.0, 2.0, 3.0], ms.float32))
    fn, x = _TINY_GRAPH
    fn(x).asnumpy()


def build_train_step(cfg: Config, shape: JobShape, topo: Topology, built: BuiltModel, total_steps: int,
                     inject_nan: bool = False) -> TrainStep:
    """``inject_nan`` (fault drills, ``training.faults``): the gradients pass through a factor the
    trainer sets to NaN at the chosen step (not with hsdp, which reduces inside its own step)."""
    params = built.params
    guard = build_guard(cfg)
    lr = build_lr(cfg, total_steps)
    oc = cfg.optimizer
    optimizer = AdamW(params, lr, betas=tuple(oc.betas), eps=float(oc.eps), weight_decay=float(oc.weight_decay))
    tp_groups, axis_groups = [], {}
    mesh = built.plan.mesh if built.plan is not None else None
    # axes whose ranks hold different pieces of the same model: tp, and ep (each rank holds its experts,
    # the dense weights are replicated there): squared norms add up over them, replicas weighted 1/size
    for axis in ("tp", "ep"):
        if mesh is not None and mesh.has_axis(axis) and mesh.axis_size(axis) > 1:
            from ..sharding.dtensor import device_mesh_of
            axis_groups[axis] = device_mesh_of(mesh).get_group(axis)
            tp_groups.append(axis_groups[axis])
    pp_group = None
    if shape.pp > 1:    # stages hold different parameters: their squared norms add up over pp
        from ..distributed.process_group import new_group
        pp_group = new_group(topo.pp_ranks)
    weights = _copy_norm_weights(topo, params, replication_weights(params, axis_groups) if axis_groups else None)
    limit = clip_limit(float(cfg.runner_config.max_grad_norm))
    stages, schedule = _pipeline_schedule(shape, topo, built) if shape.pp > 1 else (None, None)
    feed = _StageFeed(topo, pp_group)
    if shape.sharded_dp:
        wrapped = _hsdp(cfg, shape, built, stages)
        target = schedule if schedule is not None else built.model
        # hsdp's own norm group already spans the ep slices (each expert domain weighted by its copies,
        # hsdp/cell.py norm_clipper): give it tp only, or the experts' squares are counted ep times
        # (measured: pp2 x dp2 x ep2 level2 norm 1.22943 vs one process 1.22647)
        hsdp_groups = [axis_groups["tp"]] if "tp" in axis_groups else []
        hsdp_weights = replication_weights(params, {"tp": axis_groups["tp"]}) if "tp" in axis_groups else None
        hsdp_step = wrapped.train_step(target, optimizer, mode=shape.mode_name, max_grad_norm=limit,
                                       norm_groups=hsdp_groups, norm_weights=hsdp_weights, step_guard=guard)
        if schedule is not None:
            def pipeline_step(ids, labels):
                return feed.shared_loss(hsdp_step(*feed.inputs(ids, labels))), hsdp_step.grad_norm
            return TrainStep(pipeline_step, optimizer, lr, wrapped, guard)

        def micro_steps(ids, labels):      # hsdp accumulates: communication on the last micro-step only
            for mids, mlabels in micro_slices(ids, labels, shape.accumulate):
                loss = hsdp_step(mids, mlabels)
            return loss, hsdp_step.grad_norm
        return TrainStep(micro_steps, optimizer, lr, wrapped, guard)

    poison = None
    if inject_nan:
        poison = ms.Parameter(ms.Tensor(1.0, ms.float32), name="mfc_fault_poison", requires_grad=False)
    reducer = GradientReducer(params)
    clip = None
    if norm_needed(cfg, limit, guard):
        clip = ClipGradNorm(limit, tp_groups + ([pp_group] if pp_group is not None else []), weights)
    k = shape.accumulate

    def clipped(grads):
        if poison is not None:
            grads = tuple(g * poison for g in grads)
        if k > 1:
            grads = tuple(g / k for g in grads)
        grads = reducer(grads)
        return clip(grads) if clip is not None else (grads, None)

    def update(grads):          # in a graph: the guard's decision is a Tensor the optimizer reads
        grads, norm = clipped(grads)
        optimizer(grads, guard(norm) if guard is not None else None)
        return norm

    def eager_update(grads):    # PyNative: decided on the host (one read of the norm), so a step
        grads, norm = clipped(grads)     # runs the fused update alone and a skipped one nothing
        if guard is None or guard.is_ok(float(norm.asnumpy())):
            optimizer(grads)
        return norm

    if schedule is not None:
        def grads_of(ids, labels):
            loss = schedule.run(*feed.inputs(ids, labels), mode=shape.mode_name)
            return feed.shared_loss(loss), tuple(g for st in stages for g in st.grads)
    else:
        grad_fn = ms.value_and_grad(built.model, None, params)
        if k == 1:          # the whole step as one function (one graph under jit)
            def step(ids, labels):
                loss, grads = grad_fn(ids, labels)
                return loss, update(grads)

            def eager_step(ids, labels):
                loss, grads = grad_fn(ids, labels)
                return loss, eager_update(grads)
            return TrainStep(compile_blocking(step, cells=[built.model]) if shape.jit else eager_step, optimizer, lr,
                             None, guard, poison)
        grads_of = compile_blocking(grad_fn, cells=[built.model]) if shape.jit else grad_fn
    update_fn = compile_blocking(update) if shape.jit else eager_update

    def accumulating_step(ids, labels):
        total, summed = 0.0, None
        for mids, mlabels in micro_slices(ids, labels, k):
            loss, grads = grads_of(mids, mlabels)
            total = total + loss
            summed = grads if summed is None else tuple(a + g for a, g in zip(summed, grads))
        # a plain tuple of Tensors is a constant to ms.jit: it would recompile at every step
        return total / k, update_fn(ms.mutable(summed) if shape.jit else summed)
    return TrainStep(accumulating_step, optimizer, lr, None, guard, poison)


class _StageFeed:
    """What this rank's pipeline stages take and give: ids on the first stage, labels on the last,
    the loss (made on the last stage's ranks) shared with every pipeline rank for logging."""

    def __init__(self, topo: Topology, pp_group):
        self.first, self.last, self.pp_group = topo.holds_first_stage, topo.holds_last_stage, pp_group

    def inputs(self, ids, labels):
        return ids if self.first else None, labels if self.last else None

    def shared_loss(self, loss):
        from ..distributed import comm
        loss = loss if loss is not None else ms.ops.zeros((), ms.float32)
        return comm.all_reduce(loss, "sum", self.pp_group)


def _pipeline_schedule(shape: JobShape, topo: Topology, built: BuiltModel):
    """This rank's ``PipelineStage`` objects and the configured schedule over them."""
    from ..pipeline.runtime import PipelineStage
    stages = [PipelineStage(chunk, s, topo.stage_num, pp_ranks=topo.pp_ranks,
                            loss_in_cell=topo.model_stage(s) == topo.model_stage_num - 1)
              for chunk, s in zip(built.chunks, topo.stages)]
    # DualPipe (ScheduleDualPipe): stages r and 2p-1-r; the runtime gives the up copy the down copy's
    # weights before its first run and sums the two copies' gradients after every run
    return stages, build_schedule(shape.scheduler, stages, shape.micro_batch_num)


def _copy_norm_weights(topo: Topology, params, weights):
    """DualPipe holds every model stage twice on the pipeline ranks, the two copies with the same (summed)
    gradient: each counts half in the squared norm summed over pp, so that the norm is the model's."""
    if not topo.dualpipe:
        return weights
    return tuple(0.5 * w for w in (weights if weights is not None else (1.0,) * len(params)))


def _hsdp(cfg: Config, shape: JobShape, built: BuiltModel, stages):
    """hsdp (ZeRO level from the ``hsdp`` block) over the data-parallel axis of the model's (or
    each stage's) sharding plan; it owns the gradient reduction, accumulation, clipping (tp and pp
    included) and the sharded AdamW update. Level3 gathers a decoder layer's weights as one unit
    (before its forward and its backward); embedding, final norm and output layer are units of
    their own."""
    from ..hsdp import hsdp
    hc = cfg.hsdp
    target = stages if stages is not None else built.model
    pattern = "*decoder.layers.*"
    has_layers = any(fnmatch.fnmatchcase(n, pattern) for c in built.chunks for n, _ in c.cells_and_names())
    units: Optional[List[str]] = [pattern] if (hc.optimizer_level == "level3" and has_layers) else None
    try:
        return hsdp(target, shard_size=int(hc.shard_size), threshold=float(hc.threshold),
                    optimizer_level=hc.optimizer_level, accumulate_grad_step=1 if shape.pp > 1 else shape.accumulate,
                    units=units)
    except ValueError as e:
        raise ConfigError([f"hsdp = {dict(hc)}: {e}"]) from None
