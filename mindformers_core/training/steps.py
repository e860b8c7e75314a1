"""One training step ``step_fn(*batch) -> (loss, grad_norm)`` for every combination the trainer runs.

``batch`` is a tuple of tensors in the model's argument order (``(ids, labels)``, later also
``loss_mask``, ``position_ids``...). A step is assembled from three choices:

* where gradients come from: one ``value_and_grad`` of the model, or a pipeline schedule run over
  this rank's stages (the last stage's loss shared with every pipeline rank for logging; a
  pipeline takes ``(ids, labels)``, and a fine-tuning batch's loss_mask / position_ids / segment_ids as the
  runtime's side inputs, its microbatches weighted by their unmasked tokens: ``_StageFeed.microbatches``);
* who reduces and updates: ``optim.GradientUpdate`` (reduce -> clip -> guard -> update) over our
  ``GradientReducer`` + ``ClipGradNorm`` + ``StepGuard`` + ``AdamW`` (``plain_step_fn``), or hsdp
  (``parallel.enable_parallel_optimizer``: ZeRO over the data-parallel axis; its step runs the same
  ``GradientUpdate`` with its own reduction and sharded update, and owns the gradients, see
  ``hsdp_step_fn``);
* how many micro-steps: ``gradient_accumulation_steps`` slices (dim 0 of every batch tensor), gradients
  summed and their mean applied once (the same update as one batch of all rows); hsdp accumulates in
  its own buffers and communicates on the last micro-step only. With a ``loss_mask`` each micro-step's
  loss is a mean over its own unmasked tokens, so the micro-steps are weighted by their share of the
  step's unmasked tokens (counted over the data-parallel and cp ranks: ``TokenWeights``): the loss and
  gradients are those of the mean over every unmasked token of the global batch, as one process with
  the whole batch computes them.

Under jit (``context.mode: 0``) the plain model step with one micro-step is one compiled graph; with
accumulation or a pipeline, the gradient function and the update are compiled and driven by a
Python loop. In PyNative the bad-step guard decides on the host (``GradientUpdate.eager``).
"""
from __future__ import annotations

import fnmatch
import math
from dataclasses import dataclass
from typing import Callable, Iterator, List, Optional, Sequence

import mindspore as ms
from mindspore import nn

from ..common.graphs import compile_blocking
from ..optim import AdamW, ClipGradNorm, StepGuard, build_lr_schedule, replication_weights
from ..optim.update import GradientUpdate
from ..pipeline.schedules import build_schedule
from ..sharding.annotations import set_sharding_plan, sharding_plan_of
from ..sharding.parallelizer import GradientReducer
from .config import Config, ConfigError
from .model_builder import BuiltModel
from .shape import JobShape
from .topology import Topology

# the batch a pipeline feeds its stages: ids to the first stage, labels to the last
PIPELINE_BATCH = ("input_ids", "labels")


@dataclass
class TrainStep:
    step_fn: Callable            # (*batch) -> (loss, grad_norm); grad_norm None when nothing needs it
    optimizer: AdamW
    lr: object                   # the lr schedule (``lr.at(step)``)
    wrapped: Optional[object]    # the hsdp wrapper, when hsdp owns the update
    guard: Optional[StepGuard] = None   # the bad-step guard the update applies (None: every step updates)
    poison: Optional[object] = None     # MFC_FAULT "nan": a Parameter multiplied into the gradients (1 or NaN)


def clip_limit(max_grad_norm: float) -> float:
    """``runner_config.max_grad_norm`` as a clipping limit: 0 means no clipping, i.e. an infinite
    limit (the norm is still computed and logged)."""
    return max_grad_norm if max_grad_norm > 0 else math.inf


def micro_slices(batch: Sequence, k: int) -> Iterator[tuple]:
    """The ``k`` equal row slices (dim 0) of every tensor of a local batch, in order
    (gradient-accumulation micro-steps): ``k`` tuples shaped like ``batch``."""
    rows = batch[0].shape[0] // k
    for i in range(k):
        yield tuple(t[i * rows:(i + 1) * rows] for t in batch)


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
                     inject_nan: bool = False, batch_keys: Sequence[str] = PIPELINE_BATCH) -> TrainStep:
    """The step of this job (module docstring). ``inject_nan`` (fault drills, ``training.faults``): the
    gradients pass through a factor the trainer sets to NaN at the chosen step (not with hsdp, which
    reduces inside its own step). ``batch_keys``: the names of the tensors ``step_fn`` takes, in order
    (checked here: a pipeline takes ``PIPELINE_BATCH`` only)."""
    side = shape.pp > 1 and _feeds_loss_mask(cfg)     # HFDataLoader's keys go through the microbatches
    if shape.pp > 1 and not side:
        check_pipeline_batch(batch_keys)
    params = built.params
    guard = build_guard(cfg)
    lr = build_lr(cfg, total_steps)
    oc = cfg.optimizer
    optimizer = AdamW(params, lr, betas=tuple(oc.betas), eps=float(oc.eps), weight_decay=float(oc.weight_decay))
    norms = _NormGroups(shape, topo, built)
    limit = clip_limit(float(cfg.runner_config.max_grad_norm))
    stages, schedule = _pipeline_schedule(shape, topo, built, side) if shape.pp > 1 else (None, None)
    feed = _StageFeed(topo, norms.pp_group, batch_keys, TokenWeights(topo) if side else None,
                      mtp=bool(built.tied) and built.model_config.mtp_depths > 0) \
        if schedule is not None else None
    k = shape.accumulate
    if shape.sharded_dp and k > 1 and _feeds_loss_mask(cfg):
        raise ConfigError([f"runner_config.gradient_accumulation_steps = {k} with a loss_mask "
                           "(train_dataset HFDataLoader) and parallel.enable_parallel_optimizer: hsdp accumulates "
                           "the micro-steps' gradients in its own buffers, where they cannot be weighted by their "
                           "unmasked tokens (the loss would be a mean of micro-step means); use a larger "
                           "batch_size instead of accumulation, or run without hsdp"])
    if shape.sharded_dp:
        wrapped = _hsdp(cfg, shape, built, stages)
        # hsdp's own norm group already spans the ep slices (each expert domain weighted by its copies,
        # hsdp/cell.py norm_clipper): give it tp only, or the experts' squares are counted ep times
        # (measured: pp2 x dp2 x ep2 level2 norm 1.22943 vs one process 1.22647)
        tp = norms.axis_groups.get("tp")
        weights = replication_weights(params, {"tp": tp}) if tp else None
        if built.tied:              # the embedding copy on the last stage: counted once, by the first's
            weights = _without_tied_copies(built, params, weights)
        hsdp_step = wrapped.train_step(schedule if schedule is not None else built.model, optimizer,
                                       mode=shape.mode_name, max_grad_norm=limit, norm_groups=[tp] if tp else [],
                                       norm_weights=weights, step_guard=guard)
        return TrainStep(hsdp_step_fn(hsdp_step, feed, k), optimizer, lr, wrapped, guard)

    poison = None
    if inject_nan:
        poison = ms.Parameter(ms.Tensor(1.0, ms.float32), name="mfc_fault_poison", requires_grad=False)
    clip = ClipGradNorm(limit, norms.clip_groups, norms.weights) if norm_needed(cfg, limit, guard) else None
    host = HostDataSum.of(params, poison) if schedule is None else None
    update = GradientUpdate(PlainReduce(params, k, poison, skip_axes=("dp",) if host else ()), optimizer, clip, guard)
    weights = TokenWeights(topo) if k > 1 else None
    if schedule is not None:
        step = plain_step_fn(_PipelineGradients(schedule, stages, feed, shape.mode_name), update, k, shape.jit,
                             weights=weights)
    else:
        step = plain_step_fn(ms.value_and_grad(built.model, None, params), update, k, shape.jit, model=built.model,
                             weights=weights, host_sum=host)
    return TrainStep(step, optimizer, lr, None, guard, poison)


class PlainReduce(nn.Cell):
    """The ``reduce`` of the plain step's ``GradientUpdate``: the MFC_FAULT factor (``poison``), the
    mean of ``k`` summed micro-steps, then the model-parallel sums (``GradientReducer``: the axes of
    each parameter's grad axes, less ``skip_axes``: "dp" when ``HostDataSum`` sums over it before the
    update); the loss passes through."""

    def __init__(self, params, k: int = 1, poison=None, skip_axes: Sequence[str] = ()):
        super().__init__(auto_prefix=False)
        self.reducer = GradientReducer(params, skip_axes=skip_axes)
        self.k, self.poison = k, poison

    def construct(self, grads, loss):
        if self.poison is not None:
            grads = tuple(g * self.poison for g in grads)
        if self.k > 1:
            grads = tuple(g / self.k for g in grads)
        return self.reducer(grads), loss


def _feeds_loss_mask(cfg: Config) -> bool:
    import numpy as np
    from .model_builder import batch_samples
    return len(batch_samples(cfg, np.zeros((1, 1), np.int32))) > MASK


MASK = 2      # loss_mask's place in the batch tuple (common/batch.py BATCH_KEYS)


class TokenWeights:
    """Gradient accumulation over batches with a ``loss_mask``: micro-step ``i``'s weight ``k * N_i / sum(N)``,
    ``N_i`` its unmasked tokens summed over the data-parallel and context-parallel ranks (one all-gather of
    ``k`` counts per step over that group, made at the first step that needs it). ``PlainReduce`` divides
    the weighted sum by ``k``: ``sum_i N_i / N * (S_i / N_i) = sum_i S_i / N``, the masked mean of the
    whole global batch. Masks of 0/1 (counts exact below 2**24 per micro-step)."""

    def __init__(self, topo: Topology):
        self.topo, self.group = topo, None

    def __call__(self, micros: Sequence[tuple]) -> Optional[List[float]]:
        if len(micros[0]) <= MASK or micros[0][MASK] is None:
            return None                      # no mask: every micro-step has as many tokens
        import numpy as np
        from ..distributed.comm.exchange import gather_counts
        local = [float(np.asarray(m[MASK].asnumpy() if hasattr(m[MASK], "asnumpy") else m[MASK]).sum())
                 for m in micros]
        ranks = self.topo._group_of(self.topo.generator, "dp-cp")
        if len(ranks) > 1:
            if self.group is None:
                from ..distributed.process_group import new_group
                self.group = new_group(ranks)
            counts = gather_counts(self.group, local).sum(0).astype(float)
        else:
            counts = np.asarray(local)
        total = counts.sum()
        return None if total <= 0 else [len(local) * c / total for c in counts]


class HostDataSum:
    """The data-parallel gradient sum on the host, between the gradient graph and the update graph,
    through shared memory (``distributed.comm.host_sum``) instead of MindSpore's CPU all-reduce
    inside the step: on the bench Llama's 39 gradients (19 MB) 14 ms of CPU per rank instead of
    60 ms, the same bits with 2 ranks (a + b in either order). ``of(params)`` is None where it does
    not apply (no "dp" axis in any gradient's axes, other dtypes than float32, ranks on several
    hosts, several data-parallel groups among the parameters, ``MFC_HOST_SUM=0``): then the step
    keeps MindSpore's all-reduce. ``__call__(grads)`` sums the gradients that carry "dp"; the others
    pass. ``poison`` (MFC_FAULT "nan", the factor ``PlainReduce`` applies after the sum): read here and
    applied before the sum too, so that one rank's NaN reaches every rank, as through the all-reduce."""

    def __init__(self, index: Sequence[int], ranks: Sequence[int], shapes, poison=None):
        from ..distributed.comm.host_sum import HostSum
        self.index, self.summer, self.poison = tuple(index), HostSum(ranks, shapes), poison

    @classmethod
    def of(cls, params, poison=None) -> Optional["HostDataSum"]:
        from ..distributed.comm.host_sum import host_sum_applies
        from ..sharding.annotations import grad_axes_of, layout_of
        from ..sharding.dtensor import device_mesh_of
        index = [i for i, p in enumerate(params) if "dp" in grad_axes_of(p)]
        if not index:
            return None
        groups = {tuple(device_mesh_of(layout_of(params[i])).group_ranks("dp")) for i in index}
        if len(groups) != 1:
            return None
        ranks = groups.pop()
        if not host_sum_applies(ranks, [params[i].dtype for i in index]):
            return None
        return cls(index, ranks, [tuple(params[i].shape) for i in index], poison)

    def __call__(self, grads) -> tuple:
        scale = 1.0 if self.poison is None else float(self.poison.asnumpy())
        summed = self.summer([grads[i] for i in self.index], scale)
        out = list(grads)
        for i, g in zip(self.index, summed):
            out[i] = g
        return tuple(out)


def plain_step_fn(gradients: Callable, update: GradientUpdate, k: int, jit: bool, model=None,
                  weights: Optional[TokenWeights] = None, host_sum: Optional[HostDataSum] = None) -> Callable:
    """``(*batch) -> (loss, norm)``: ``k`` micro-steps of ``gradients(*micro) -> (loss, grads)``, their
    gradients summed, then ``update`` once. ``model``: ``gradients`` is that model's ``value_and_grad``
    (compiled under jit; with ``k == 1`` the whole step is one function: one graph); without it (a
    pipeline) ``gradients`` runs eagerly around its stages' own graphs. ``host_sum``: the data-parallel
    sum between the gradients and the update (``HostDataSum``; the step is then two graphs under jit)."""
    # in a graph the guard's decision is a Tensor the optimizer reads; in PyNative it is taken on the host
    finish = update if jit else update.eager

    def apply(grads, loss):
        loss, norm, _ = finish(grads, loss)
        return loss, norm
    if model is not None and k == 1 and host_sum is None:
        def step(*batch):
            loss, grads = gradients(*batch)
            return apply(grads, loss)
        return compile_blocking(step, cells=[model]) if jit else step
    if model is not None and jit:
        gradients = compile_blocking(gradients, cells=[model])
    apply_fn = compile_blocking(apply) if jit else apply

    def accumulating_step(*batch):
        if k == 1 and host_sum is not None:
            loss, grads = gradients(*batch)
            return apply_fn(ms.mutable(host_sum(grads)) if jit else host_sum(grads), loss)
        total, summed = 0.0, None
        micros = list(micro_slices(batch, k))
        scale = weights(micros) if weights is not None else None
        for i, micro in enumerate(micros):
            loss, grads = gradients(*micro)
            if scale is not None:          # a loss_mask: micro-steps weighted by their unmasked tokens
                loss, grads = loss * scale[i], tuple(g * scale[i] for g in grads)
            total = total + loss
            summed = grads if summed is None else tuple(a + g for a, g in zip(summed, grads))
        if host_sum is not None:
            summed = host_sum(summed)
        # a plain tuple of Tensors is a constant to ms.jit: it would recompile at every step
        return apply_fn(ms.mutable(summed) if jit else summed, total / k)
    return accumulating_step


def hsdp_step_fn(hsdp_step, feed: Optional["_StageFeed"], k: int) -> Callable:
    """``(*batch) -> (loss, norm)`` over hsdp's step, which owns the gradients, the accumulation
    (communication on the last micro-step only) and the update: ``k`` calls on the micro-slices, or
    one schedule run fed by ``feed`` (a pipeline)."""
    if feed is not None and feed.weights is not None:   # loss_mask, position_ids, segment_ids: microbatches
        m = hsdp_step.schedule.micro_batch_num

        def side_pipeline_step(*batch):
            return feed.shared_loss(hsdp_step(microbatches=feed.microbatches(batch, m))), hsdp_step.grad_norm
        return side_pipeline_step
    if feed is not None:
        def pipeline_step(*batch):
            return feed.shared_loss(hsdp_step(*feed.inputs(batch))), hsdp_step.grad_norm
        return pipeline_step

    def micro_steps(*batch):
        for micro in micro_slices(batch, k):
            loss = hsdp_step(*micro)
        return loss, hsdp_step.grad_norm
    return micro_steps


def check_pipeline_batch(batch_keys: Sequence[str]) -> None:
    """A pipeline feeds its stages ``PIPELINE_BATCH`` only: a ValueError naming any other batch key."""
    if tuple(batch_keys) != PIPELINE_BATCH:
        extra = [k for k in batch_keys if k not in PIPELINE_BATCH]
        raise ValueError(f"pipeline parallelism (pipeline_stage > 1) feeds its stages {list(PIPELINE_BATCH)} only; "
                         f"this job's batch is {list(batch_keys)} (extra: {extra}): run it without pipeline "
                         "parallelism, or without those batch keys")


class _NormGroups:
    """The groups the global gradient norm sums over beyond data parallel: the axes whose ranks hold
    different pieces of the same model (tp, and ep: each rank holds its experts, the dense weights are
    replicated there; squares weighted 1/copies), and pp (stages hold different parameters;
    DualPipe's two copies of a stage count half each)."""

    def __init__(self, shape: JobShape, topo: Topology, built: BuiltModel):
        self.axis_groups = {}
        mesh = built.plan.mesh if built.plan is not None else None
        for axis in ("tp", "ep"):
            if mesh is not None and mesh.has_axis(axis) and mesh.axis_size(axis) > 1:
                from ..sharding.dtensor import device_mesh_of
                self.axis_groups[axis] = device_mesh_of(mesh).get_group(axis)
        self.pp_group = None
        if shape.pp > 1:
            from ..distributed.process_group import new_group
            self.pp_group = new_group(topo.pp_ranks)
        self.clip_groups = list(self.axis_groups.values()) + ([self.pp_group] if self.pp_group is not None else [])
        params = built.params
        self.weights = _copy_norm_weights(topo, params, replication_weights(params, self.axis_groups)
                                          if self.axis_groups else None)
        if built.tied and not topo.dualpipe:   # the embedding copy on the last stage: counted once, by the first's
            self.weights = _without_tied_copies(built, params, self.weights)


def _without_tied_copies(built: BuiltModel, params, weights):
    """Norm weights (None: all 1) with the last stage's copies of a tied parameter (``built.tied``: the embedding
    table of tied embeddings or MTP) at 0: their gradient equals the first stage's, which counts once."""
    copy = {id(p) for p in built.copies if p.name in built.tied}
    return tuple(0.0 if id(p) in copy else w for p, w in zip(params, weights or (1.0,) * len(params)))


class _PipelineGradients:
    """``(ids, labels) -> (loss, grads)``: one schedule run over this rank's stages; the loss shared
    with every pipeline rank, the summed gradients of this rank's stages (of its parameters in order, each once)."""

    def __init__(self, schedule, stages, feed: "_StageFeed", mode: str):
        self.schedule, self.stages, self.feed, self.mode = schedule, stages, feed, mode

    def __call__(self, *batch):
        if self.feed.weights is not None:     # loss_mask, position_ids, segment_ids through the microbatches
            xs, ys, side = self.feed.microbatches(batch, self.schedule.micro_batch_num)
            loss = self.schedule.run_microbatches(xs, ys, mode=self.mode, side=side)
        else:
            loss = self.schedule.run(*self.feed.inputs(batch), mode=self.mode)
        seen, grads = set(), []
        for st in self.stages:      # a Parameter two stages share (MTP's embedding, pipeline/runtime.py): once
            for p, g in zip(st.params, st.grads):
                if id(p) not in seen:
                    seen.add(id(p))
                    grads.append(g)
        return self.feed.shared_loss(loss), tuple(grads)


class _StageFeed:
    """What this rank's pipeline stages take and give: ids on the first stage, labels on the last,
    the loss (made on the last stage's ranks) shared with every pipeline rank for logging."""

    def __init__(self, topo: Topology, pp_group, batch_keys: Sequence[str] = PIPELINE_BATCH,
                 weights: Optional[TokenWeights] = None, mtp: bool = False):
        self.first, self.last, self.pp_group = topo.holds_first_stage, topo.holds_last_stage, pp_group
        self.batch_keys = tuple(batch_keys)
        self.weights = weights
        self.mtp = mtp      # multi-token prediction: the last stage also takes the microbatch's ids

    def microbatches(self, batch: Sequence, m: int):
        """A fine-tuning batch (ids, labels, loss_mask[, position_ids[, segment_ids]]) as the runtime's
        microbatches: ids to the first stage; (labels, loss_mask, weight) to the last, the weight ``m N_i / N``
        (``TokenWeights``: microbatch ``i``'s share of the step's unmasked tokens over dp and cp; the stage
        objective divides by ``m``); (position_ids, segment_ids) to every stage (absent: 0..s-1 and one
        document per row)."""
        import numpy as np
        from mindspore import Tensor
        ids, labels = batch[0], batch[1]
        b, seq = ids.shape
        extra = list(batch[2:]) + [None] * (5 - len(batch))
        mask, pos, seg = extra
        if mask is None:
            mask = Tensor(np.ones((b, seq), np.float32))
        if pos is None:
            pos = Tensor(np.tile(np.arange(seq, dtype=np.int32), (b, 1)))
        if seg is None:
            seg = Tensor(np.zeros((b, seq), np.int32))
        micros = list(micro_slices((ids, labels, mask, pos, seg), m))
        w = self.weights(micros) or [1.0] * m
        xs = [mb[0] for mb in micros] if self.first else None
        ys = [(mb[1], mb[2], Tensor(np.float32(w[i]))) + ((mb[0],) if self.mtp else ())
              for i, mb in enumerate(micros)] if self.last else None
        return xs, ys, [(mb[3], mb[4]) for mb in micros]

    def inputs(self, batch: Sequence):
        if len(batch) != len(PIPELINE_BATCH):
            extra = list(self.batch_keys[len(PIPELINE_BATCH):]) or [f"tensor {i}" for i in range(2, len(batch))]
            raise ValueError(f"pipeline: the step takes the batch {list(PIPELINE_BATCH)} only, got {len(batch)} "
                             f"tensors (extra: {extra})")
        ids, labels = batch
        return ids if self.first else None, ((labels, ids) if self.mtp else labels) if self.last else None

    def shared_loss(self, loss):
        from ..distributed import comm
        loss = loss if loss is not None else ms.ops.zeros((), ms.float32)
        return comm.all_reduce(loss, "sum", self.pp_group)


class _SideInputStage(nn.Cell):
    """A model stage fed (input, position_ids, segment_ids[, labels, loss_mask, weight]) by the runtime (side
    inputs, ``_StageFeed.microbatches``): the model chunk takes them in its own argument order; the last stage's
    loss is weighted by its microbatch's token share (``token_ids``: the microbatch's ids, for the multi-token
    prediction depths of a last stage)."""

    def __init__(self, chunk: nn.Cell, last: bool):
        super().__init__(auto_prefix=False)
        self.chunk, self.last = chunk, last
        self.mtp = last and getattr(chunk, "takes_token_ids", False)
        _carry_plan(self, chunk)

    def construct(self, x, position_ids, segment_ids, labels=None, loss_mask=None, weight=None, token_ids=None):
        if self.mtp:
            return self.chunk(x, labels, loss_mask, position_ids, segment_ids, token_ids) * weight
        if self.last:
            return self.chunk(x, labels, loss_mask, position_ids, segment_ids) * weight
        return self.chunk(x, None, None, position_ids, segment_ids)


class _TokenIdsStage(nn.Cell):
    """The last stage of a pipeline with multi-token prediction, fed (hidden states, labels, ids): the model
    chunk takes the ids as ``token_ids`` (its MTP depths' embedding lookup, ``GPTModel``)."""

    def __init__(self, chunk: nn.Cell):
        super().__init__(auto_prefix=False)
        self.chunk = chunk
        _carry_plan(self, chunk)

    def construct(self, x, labels, token_ids):
        return self.chunk(x, labels, None, None, None, token_ids)


def _carry_plan(wrapper: nn.Cell, chunk: nn.Cell) -> None:
    """A stage wrapper answers ``sharding_plan_of`` with its chunk's plan: hsdp over the stages reads each stage
    Cell's data-parallel ranks there (``hsdp/groups.py`` ``plan_dp_ranks``)."""
    plan = sharding_plan_of(chunk)
    if plan is not None:
        set_sharding_plan(wrapper, plan)


def _pipeline_schedule(shape: JobShape, topo: Topology, built: BuiltModel, side: bool = False):
    """This rank's ``PipelineStage`` objects and the configured schedule over them (``side``: the stages take
    the fine-tuning batch's per-token keys, ``_SideInputStage``)."""
    from ..pipeline.runtime import PipelineStage
    last = topo.model_stage_num - 1
    chunks = [_SideInputStage(c, topo.model_stage(s) == last) if side
              else _TokenIdsStage(c) if getattr(c, "takes_token_ids", False) else c
              for c, s in zip(built.chunks, topo.stages)]
    stages = [PipelineStage(chunk, s, topo.stage_num, pp_ranks=topo.pp_ranks,
                            loss_in_cell=topo.model_stage(s) == topo.model_stage_num - 1)
              for chunk, s in zip(chunks, topo.stages)]
    # DualPipe (ScheduleDualPipe): stages r and 2p-1-r; the runtime gives the up copy the down copy's
    # weights before its first run and sums the two copies' gradients after every run
    schedule = build_schedule(shape.scheduler, stages, shape.micro_batch_num)
    # parameters on several model stages (the embedding and its last-stage copy: tied embeddings, MTP): gradients
    # summed by the runtime over every stage index running the first or the last model stage
    ends = [s for s in range(topo.stage_num) if topo.model_stage(s) in (0, last)]
    schedule.tied = {name: ends for name in built.tied}
    return stages, schedule


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
