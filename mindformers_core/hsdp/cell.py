"""The model wrapped by ``hsdp``: ``HSDPCell`` owns the sharding plan, the groups and the
collectives; ``HsdpTrainStep`` is its compiled/PyNative training micro-step; ``hsdp_update`` the
reduce -> clip -> guard -> update of an hsdp step and ``norm_clipper`` the global-norm clipping of
hsdp-reduced gradients (both shared with ``pipeline.py``).

See ``api.py`` for the entry point ``hsdp(cell, ...)``, ``plan.py`` for how ranks and parameters
are split, ``step.py`` for the step's Cells and docs/hsdp.md for the whole story.
"""
from __future__ import annotations

import contextlib
import dataclasses
import itertools
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import mindspore as ms
from mindspore import Parameter, ParameterTuple, Tensor, nn

from ..common.graphs import compile_blocking
from ..distributed.env import get_env
from ..distributed.process_group import new_group
from ..optim.clip import ClipGradNorm
from ..optim.update import GradientUpdate
from ..sharding.annotations import is_sharded_parameter, layout_of
from ..sharding.layout import as_layout
from ..sharding.parallelizer import GradientReducer, forget_cached_shapes
from . import plan as P
from .step import (Accumulate, Comm, Drain, HsdpReduce, MultiGather, MultiGradReducer, ShardedUpdate,
                   accumulation_buffers)
from .units import UnitGathering

_IDS = itertools.count()


def _dp_axes_of(layout) -> Tuple[str, ...]:
    """The mesh axes a parallelized model's ``"dp"`` stands for: ``("dp",)``, or its axis group
    (``("edp", "ep")`` on the expert mesh); ``()`` when the mesh has no data parallel."""
    groups = getattr(layout, "axis_groups", None) or {}
    if "dp" in groups:
        return tuple(groups["dp"])
    return ("dp",) if "dp" in layout.alias_name else ()


def _param_domains(params):
    """``(domains, domain of each parameter, dp axes)``: domain 0 (``None``) is every dp rank;
    a parameter split over some of the dp axes (an expert weight over ``ep``) belongs to the domain
    of the dp axes it is replicated over (``("edp",)``), in order of first appearance."""
    domains: List[Optional[Tuple[str, ...]]] = [None]
    domain_of: Dict[int, int] = {}
    dp_axes: Tuple[str, ...] = ()
    for p in params:
        layout, k = layout_of(p), 0
        axes = _dp_axes_of(layout) if layout is not None else ()
        if axes:
            dp_axes = axes
            split = set(as_layout(layout).sharded_axes())
            kept = tuple(a for a in axes if a not in split)
            if kept != axes:
                if kept not in domains:
                    domains.append(kept)
                k = domains.index(kept)
        domain_of[id(p)] = k
    return domains, domain_of, dp_axes


def _domain_ranks(param, axes: Tuple[str, ...], dp_ranks: Sequence[int]) -> List[int]:
    """The ranks along ``axes`` of ``param``'s mesh holding this rank, in data-parallel order."""
    from ..sharding.dtensor import device_mesh_of
    mesh = device_mesh_of(layout_of(param))
    ranks = mesh.group_ranks(axes) if axes else [get_env().rank]
    outside = sorted(set(ranks) - set(dp_ranks))
    if outside:
        raise ValueError(f"hsdp: {param.name!r} is replicated over ranks {sorted(ranks)} (mesh axes {list(axes)}), "
                         f"but ranks {outside} are not in the data-parallel group {list(dp_ranks)}; leave "
                         "dp_group=None to use the model's sharding plan")
    return sorted(ranks, key=list(dp_ranks).index)


class Domain:
    """Ranks over which a set of parameters is replicated within data parallel, with its own hsdp
    shard size and groups (``P.shard_rank_lists``)."""

    def __init__(self, axes: Optional[Tuple[str, ...]], ranks: Sequence[int], shard_size: int, rank: int):
        self.axes, self.ranks, self.shard_size = axes, list(ranks), shard_size
        self.shard_ranks, self.replica_ranks = P.shard_rank_lists(self.ranks, shard_size, rank)
        self.dp_group = self.shard_group = self.replica_group = None

    def create_groups(self) -> None:
        self.dp_group = new_group(self.ranks)
        self.shard_group = new_group(self.shard_ranks)
        self.replica_group = new_group(self.replica_ranks)


class HSDPCell(nn.Cell):
    """The wrapped model: calls ``cell`` and owns the sharding plan, groups and collectives.
    At level3 the sharded parameters are held as shards; ``units`` (a ``UnitGathering``)
    gathers them per unit around its forward and backward."""

    def __init__(self, cell: nn.Cell, dp_ranks: Sequence[int], shard_size: int, threshold: float,
                 level: str, accumulate_grad_step: int, units: Optional[Sequence[str]] = None):
        super().__init__(auto_prefix=False)
        env = get_env()
        self.network = cell
        self.level, self.shard_size, self.threshold = level, shard_size, threshold
        self.accumulate_grad_step = accumulate_grad_step
        dp_ranks = list(dp_ranks)
        # a domain = the ranks over which a parameter is replicated within data parallel: every
        # dp rank (domain 0), or for expert parameters split over "ep" their expert-data-parallel
        # group (docs/moe.md); each domain has its own shard and replica groups
        params = list(cell.trainable_params())
        domain_axes, domain_of, self.dp_axes = _param_domains(params)
        self.domains: List[Domain] = []
        for k, axes in enumerate(domain_axes):
            if axes is None:
                ranks, size = dp_ranks, shard_size
            else:
                owner = next(p for p in params if domain_of[id(p)] == k)
                ranks = _domain_ranks(owner, axes, dp_ranks)
                size = P.domain_shard_size(shard_size, len(dp_ranks), len(ranks))
            self.domains.append(Domain(axes, ranks, size, env.rank))
        # creation order is the same on every rank: per domain dp, shard, replica
        for d in self.domains:
            d.create_groups()
        dense = self.domains[0]
        self.dp_group, self.shard_group, self.replica_group = dense.dp_group, dense.shard_group, dense.replica_group
        self._tag = f"{next(_IDS)}"
        # a plain list attribute: nn.Cell would register (and rename) a list of Parameters
        object.__setattr__(self, "_hsdp_params", params)
        self.plans: Dict[int, P.ParamPlan] = {}
        self.domain_of: Dict[int, int] = {}
        for p in self._hsdp_params:
            k = domain_of[id(p)]
            d = self.domains[k]
            plan = P.plan_param(p.name, p.shape, p.itemsize, d.shard_size, threshold, d.shard_group.local_rank)
            if d.axes is not None:       # an expert parameter: its own data-parallel domain
                n = d.dp_group.size
                plan = dataclasses.replace(plan, reason=plan.reason + f" over {'x'.join(d.axes) or 'no axis'} "
                                           f"({n} rank{'s' if n > 1 else ''})")
            if layout_of(p) is not None:   # already a tensor-parallel shard
                plan = dataclasses.replace(plan, reason=plan.reason + " (of the local tp shard)")
            self.plans[id(p)] = plan
            self.domain_of[id(p)] = k
        self.collectives = Parameter(Tensor(np.zeros((1,), np.float32)), name=f"hsdp_calls_{self._tag}",
                                     requires_grad=False)
        self.comms = [Comm(d.dp_group, d.shard_group, d.replica_group, self.collectives) for d in self.domains]
        self.comm = self.comms[0]
        self.gather = self.multi_gather([pl for _, pl in self.sharded_params()],
                                        [self.domain_of[id(p)] for p, _ in self.sharded_params()])
        self._unit_gathers: Dict[tuple, MultiGather] = {}
        self._full = True
        self.units: Optional[UnitGathering] = None
        if level == "level3":
            self._reshard()
            self.units = UnitGathering(self, units)
        self._updaters: Dict[tuple, ShardedUpdate] = {}
        self._reducers: Dict[tuple, MultiGradReducer] = {}

    # ---- model ------------------------------------------------------------------------------
    def construct(self, *args, **kwargs):
        return self.network(*args, **kwargs)

    def plan_of(self, param) -> P.ParamPlan:
        return self.plans[id(param)]

    def describe(self) -> str:
        """A table: every parameter, its shape, whether and how it is sharded."""
        return P.plan_table([self.plans[id(p)] for p in self._hsdp_params], self.level, self.shard_size)

    def collective_count(self) -> int:
        """Collectives issued by this wrapper so far (gradient, parameter and loss reductions)."""
        return int(self.collectives.asnumpy()[0])

    # ---- level3: parameters held as shards between steps -------------------------------------
    def unit_gather(self, params: Sequence[Parameter]) -> MultiGather:
        """The bucketed all-gather of these parameters (built once per set; one per domain)."""
        key = tuple(id(p) for p in params)
        if key not in self._unit_gathers:
            self._unit_gathers[key] = self.multi_gather([self.plans[id(p)] for p in params],
                                                        [self.domain_of[id(p)] for p in params])
        return self._unit_gathers[key]

    def multi_gather(self, plans: Sequence[P.ParamPlan], domains: Sequence[int]) -> MultiGather:
        return MultiGather(list(plans), list(domains), self.comms)

    def grad_reducer(self, params: Sequence[Parameter], scale: float) -> MultiGradReducer:
        """The reduction of ``params``' gradients, each over its own domain (see ``MultiGradReducer``)."""
        return MultiGradReducer([self.plans[id(p)] for p in params], [self.domain_of[id(p)] for p in params],
                                self.level, self.comms, scale)

    def params_of(self, plans: Sequence[P.ParamPlan]) -> List[Parameter]:
        by_plan = {id(self.plans[id(p)]): p for p in self._hsdp_params}
        return [by_plan[id(pl)] for pl in plans]

    def norm_group(self):
        """``(group, copies)`` for global-norm clipping: the group over which the squared norms are
        summed (None: one rank) and ``copies(param, plan)``, how many of its ranks hold the same piece."""
        level, dense = self.level, self.domains[0]
        extra = [d for d in self.domains[1:]]
        ratios = {len(dense.ranks) // len(d.ranks) for d in extra}
        if len(ratios) > 1:
            raise ValueError(f"hsdp: parameters replicated over data-parallel subgroups of different sizes "
                             f"{sorted(len(d.ranks) for d in extra)}: global-norm clipping supports one expert size")
        r = ratios.pop() if ratios else 1
        S = dense.shard_size
        L = P.lcm(S, r)
        if L == S:
            group = self.shard_group if S > 1 else None
        else:   # the block of L consecutive dp ranks holding this rank
            i = dense.ranks.index(get_env().rank)
            group = new_group(dense.ranks[(i // L) * L:(i // L + 1) * L])

        def copies(param, plan):
            d = self.domains[self.domain_of[id(param)]]
            split = plan.sharded and level != "level1"
            if d is dense:
                return L // S if split else L
            held = L // r            # domain ranks in the block (one per ep slice each)
            return held // d.shard_size if split else held
        return group, copies

    @property
    def reduce_skip_axes(self) -> Tuple[str, ...]:
        """Mesh axes hsdp reduces over (a parallelized model's ``"dp"`` and the axes it groups: ``edp``, ``ep``):
        a model-parallel reducer before hsdp sums the others only."""
        return ("dp",) + tuple(a for a in self.dp_axes if a != "dp")

    def sharded_params(self):
        """``[(parameter, plan)]`` of the parameters this wrapper shards."""
        return [(p, self.plans[id(p)]) for p in self._hsdp_params if self.plans[id(p)].sharded]

    def _unshard(self) -> None:
        """Level3: gather every sharded parameter into its full shape (in place)."""
        if self._full:
            return
        pairs = self.sharded_params()
        if pairs:
            fulls = self.gather(tuple(p for p, _ in pairs))
            for (p, _), full in zip(pairs, fulls):
                p.set_data(full, slice_shape=True)
            forget_cached_shapes()
        self._full = True

    def _reshard(self, shards: Optional[Sequence[Tensor]] = None) -> None:
        """Level3: keep only this rank's shard of every sharded parameter (given, or cut from the
        full value)."""
        pairs = self.sharded_params()
        if shards is None:
            shards = []
            for p, plan in pairs:
                if tuple(p.shape) == plan.shard_shape and plan.shard_shape != plan.shape:
                    shards.append(None)   # already a shard
                    continue
                shards.append(Tensor(self.shard_of(p, p.asnumpy())))
        resized = False
        for (p, _), s in zip(pairs, shards):
            if s is not None:
                p.set_data(s, slice_shape=True)
                resized = True
        if resized:   # e.g. a lookup traced by parallelize on the full table cached its shape
            forget_cached_shapes()
        self._full = False

    @contextlib.contextmanager
    def unsharded(self) -> Iterator["HSDPCell"]:
        """Level3: full parameters inside the block (e.g. evaluation, saving); shards after it.
        Changes made to the full parameters inside the block are kept. No-op at level1/2."""
        if self.level != "level3":
            yield self
            return
        self._unshard()
        try:
            yield self
        finally:
            if self._full:
                self._reshard()

    @property
    def holds_full_params(self) -> bool:
        """Level3: True while the parameters are gathered (inside ``unsharded()``), False while
        they are this rank's shards. Always True at level1/2."""
        return self._full

    def gather_full_params(self) -> Dict[str, np.ndarray]:
        """Every trainable parameter's full local value, by name (collective at level3)."""
        with self.unsharded():
            return {p.name: p.asnumpy().copy() for p in self._hsdp_params}

    # ---- optimizer ----------------------------------------------------------------------------
    def optimizer_plans(self, optimizer) -> List[P.ParamPlan]:
        """The ``ParamPlan`` of each parameter ``optimizer`` updates, in its order (checks that it
        follows the Optimizer protocol and only updates parameters of the wrapped cell)."""
        params = getattr(optimizer, "parameters", None)
        if params is None or not hasattr(optimizer, "apply") or not hasattr(optimizer, "state_of"):
            raise TypeError(f"hsdp: optimizer {type(optimizer).__name__} must follow the "
                            "mindformers_core.optim.Optimizer protocol (parameters, apply, state_of); "
                            "use mindformers_core.optim.AdamW")
        out = []
        for p in params:
            if id(p) not in self.plans:
                raise ValueError(f"hsdp: the optimizer updates {p.name!r}, which is not a trainable "
                                 "parameter of the wrapped cell; build it from wrapped.trainable_params()")
            out.append(self.plans[id(p)])
        return out

    def shard_optimizer(self, optimizer):
        """Shrink the optimizer's states of sharded parameters to this rank's shard (in place,
        same Parameter objects). Idempotent; returns the optimizer."""
        plans = self.optimizer_plans(optimizer)
        for i, plan in enumerate(plans):
            if not plan.sharded:
                continue
            for state in optimizer.state_of(i):
                shape = tuple(state.shape)
                if shape == plan.shard_shape:
                    continue
                if shape != plan.shape:
                    raise ValueError(f"hsdp: optimizer state {state.name!r} has shape {shape}; expected "
                                     f"{plan.shape} (full) or {plan.shard_shape} (shard)")
                state.set_data(Tensor(self.shard_of(optimizer.parameters[i], state.asnumpy())), slice_shape=True)
        return optimizer

    def shard_of(self, param, full: np.ndarray) -> np.ndarray:
        """This rank's hsdp shard of ``full`` (an array shaped like ``param``'s full local value,
        e.g. an optimizer state read from a checkpoint); ``full`` itself when not sharded."""
        plan = self.plans[id(param)]
        if not plan.sharded:
            return full
        index = [slice(None)] * len(plan.shape)
        index[plan.dim] = slice(plan.offset, plan.offset + plan.shard_shape[plan.dim])
        return full[tuple(index)]

    def full_optimizer_states(self, optimizer) -> List[List[np.ndarray]]:
        """Every optimizer state at its full shape (sharded ones all-gathered over the shard group:
        a collective), per optimizer parameter — what a checkpoint stores."""
        plans = self.optimizer_plans(optimizer)
        out = [[s.asnumpy() for s in optimizer.state_of(i)] for i in range(len(plans))]
        position = {id(p): i for i, p in enumerate(optimizer.parameters)}
        order = [position[id(p)] for p, _ in self.sharded_params() if id(p) in position]
        if not order or len(order) != len(self.sharded_params()):
            return out   # nothing sharded, or an optimizer over a subset (the bucketed gather needs all)
        for k in range(len(out[order[0]])):
            fulls = self.gather(tuple(optimizer.state_of(i)[k] for i in order))
            for i, full in zip(order, fulls):
                out[i][k] = full.asnumpy()
        return out

    # ---- the manual pair (PyNative) -----------------------------------------------------------
    def reduce_gradients(self, grads: Sequence[Tensor], params: Optional[Sequence[Parameter]] = None):
        """Average ``grads`` (of ``params``, default ``trainable_params()``) over the dp group:
        full tensors for unsharded parameters and at level1, this rank's shard at level2/3."""
        params = list(params) if params is not None else self._hsdp_params
        key = tuple(id(p) for p in params)
        reducer = self._reducers.get(key)
        if reducer is None:
            reducer = self._reducers[key] = self.grad_reducer(params, 1.0 / self.dp_group.size)
        return reducer(tuple(grads), Tensor(np.zeros((), np.float32)))[0]

    def sharded_update(self, optimizer, params_sharded: bool = False) -> ShardedUpdate:
        """The (cached) Cell updating this rank's shards with ``optimizer`` from reduced gradients;
        shards the optimizer's states on first use."""
        key = (id(optimizer), params_sharded)
        up = self._updaters.get(key)
        if up is None:
            plans = self.optimizer_plans(optimizer)
            self.shard_optimizer(optimizer)
            up = self._updaters[key] = ShardedUpdate(optimizer, plans, self.level, self.comm, params_sharded,
                                                     comms=self.comms,
                                                     domains=[self.domain_of[id(p)] for p in optimizer.parameters])
        return up

    def apply_gradients(self, grads: Sequence[Tensor], optimizer) -> None:
        """Step ``optimizer`` with reduced gradients (from ``reduce_gradients``, in the optimizer's
        parameter order). Level3: the shards are updated in place; inside ``unsharded()`` the full
        parameters are, and they are shards again afterwards."""
        if self.level == "level3" and not self._full:
            if self.units is None:
                raise RuntimeError("hsdp level3 over pipeline stages: apply_gradients needs the full "
                                   "parameters; apply them inside `with wrapped.unsharded():`")
            self.sharded_update(optimizer, params_sharded=True)(tuple(grads))
            return
        shards = self.sharded_update(optimizer)(tuple(grads))
        if self.level == "level3":
            self._reshard(shards)

    # ---- the training step ------------------------------------------------------------------
    def train_step(self, loss_fn: Callable, optimizer, mode: str = "pynative",
                   max_grad_norm: Optional[float] = None, norm_groups: Sequence = (),
                   norm_weights: Optional[Sequence[float]] = None, step_guard=None) -> "HsdpTrainStep":
        """A callable ``step(*batch) -> loss`` doing one micro-step (see ``HsdpTrainStep``)."""
        return HsdpTrainStep(self, loss_fn, optimizer, mode, max_grad_norm, norm_groups, norm_weights, step_guard)


def norm_clipper(wrapped: HSDPCell, plans: Sequence[P.ParamPlan], max_grad_norm: Optional[float],
                 norm_groups: Sequence = (), norm_weights: Optional[Sequence[float]] = None):
    """Global-norm clipping of hsdp-reduced gradients (None without ``max_grad_norm``): sharded
    pieces (level2/3) count once, pieces replicated over the shard group ``1/shard_size`` times
    each; ``norm_groups`` (tensor/pipeline groups) and ``norm_weights`` extend it to model parallelism.

    With expert parameters (a second domain, see ``HSDPCell``) the squares are summed over the
    ``lcm(shard_size, ep)`` consecutive dp ranks holding this rank: every expert slice and every
    shard of the dense parameters lies in it; each piece is weighted by 1 / its copies there."""
    if max_grad_norm is None:
        return None
    params = wrapped.params_of(plans)
    group, copies = wrapped.norm_group()
    weights = [1.0 / copies(p, pl) for p, pl in zip(params, plans)]
    if norm_weights is not None:
        if len(norm_weights) != len(plans):
            raise ValueError(f"train_step: norm_weights has {len(norm_weights)} entries for {len(plans)} parameters")
        weights = [w * float(u) for w, u in zip(weights, norm_weights)]
    groups = ([group] if group is not None else []) + list(norm_groups)
    return ClipGradNorm(max_grad_norm, groups, weights)


def hsdp_update(wrapped: HSDPCell, optimizer, max_grad_norm: Optional[float] = None, norm_groups: Sequence = (),
                norm_weights: Optional[Sequence[float]] = None, step_guard=None, accumulate: int = 1,
                drain: Optional[Drain] = None, pipeline_groups: Optional[Callable[[], list]] = None) -> GradientUpdate:
    """The reduce -> clip -> guard -> update of an hsdp step (``HsdpTrainStep`` and the pipeline's
    ``PipelineTrainStep``): ``GradientUpdate(HsdpReduce(...), ShardedUpdate, clip, guard)``.

    A model sharded by ``parallelize`` already returns the global loss and scales its backward by
    1/dp (its gradients are partial sums over dp): they are summed over dp, after the model-parallel
    axes (e.g. tp for sequence-parallel norm weights); a replicated model's local gradients are
    averaged. ``accumulate`` micro-steps (their sums, ``drain``) divide the gradients once more.
    ``pipeline_groups()`` (with clipping; called after the reductions are built, as every rank
    creates its groups in the same order): the pipeline groups the squared norms are summed over,
    before ``norm_groups``."""
    plans = wrapped.optimizer_plans(optimizer)
    params = tuple(optimizer.parameters)
    dp = wrapped.dp_group.size
    sharded_model = any(is_sharded_parameter(p) for p in params)
    mp_reducer = GradientReducer(params, skip_axes=wrapped.reduce_skip_axes) if sharded_model else None
    scale = 1.0 / accumulate if sharded_model else 1.0 / (dp * accumulate)
    reduce = HsdpReduce(wrapped.grad_reducer(params, scale), mp_reducer, float(dp) if sharded_model else 1.0, drain)
    apply = wrapped.sharded_update(optimizer, params_sharded=wrapped.units is not None)
    if max_grad_norm is not None and pipeline_groups is not None:
        norm_groups = list(pipeline_groups()) + list(norm_groups)
    clip = norm_clipper(wrapped, plans, max_grad_norm, norm_groups, norm_weights)
    guard = step_guard if step_guard is not None and step_guard.enabled else None
    # every output a Tensor (the loss stands for a norm not computed): a graph holding data-dependent
    # shapes keeps MindSpore's asynchronous launch (common/graphs.py)
    return GradientUpdate(reduce, apply, clip, guard, tensor_outputs=True)


class HsdpTrainStep:
    """One micro-step per call: ``loss_fn(*batch)`` (a function or Cell computing the loss of
    this rank's batch with the wrapped model), gradients, and on every
    ``accumulate_grad_step``-th call the reduction, optional clipping and the optimizer step
    (``hsdp_update``: one ``optim.GradientUpdate``).

    Returns this micro-step's local loss, except on the last micro-step: the loss averaged over
    the micro-steps and the data-parallel group (the global-batch loss for a mean loss).

    ``mode="jit"`` compiles two graphs (accumulate-only and full step); the parameters are passed
    to them as arguments, so in-place changes between steps are seen by the graphs. At level3 the
    parameters change shape inside the step (``hsdp/units.py``): the forward/backward runs in
    PyNative with every unit compiled as its own graph, and the accumulation and the
    reduce/clip/update step are compiled. ``max_grad_norm`` clips by the global norm: sharded gradient
    pieces count once, pieces replicated over the shard group ``1/shard_size`` times each;
    ``norm_groups`` (e.g. tensor- and pipeline-parallel groups) and ``norm_weights`` (per
    parameter, e.g. ``optim.replication_weights``) extend it to model parallelism. ``step_guard``
    (``optim.StepGuard``, needs ``max_grad_norm``: the norm it reads) skips the optimizer step of a
    bad norm on every rank.
    """

    def __init__(self, wrapped: HSDPCell, loss_fn: Callable, optimizer, mode: str = "pynative",
                 max_grad_norm: Optional[float] = None, norm_groups: Sequence = (),
                 norm_weights: Optional[Sequence[float]] = None, step_guard=None):
        if mode not in ("pynative", "jit"):
            raise ValueError(f"train_step: mode={mode!r}; valid modes are 'pynative' and 'jit'")
        self.wrapped, self.mode = wrapped, mode
        plans = wrapped.optimizer_plans(optimizer)
        self.params = tuple(optimizer.parameters)
        k = wrapped.accumulate_grad_step
        self.k, self.micro = k, 0
        self.grad_fn = ms.value_and_grad(loss_fn, None, ParameterTuple(self.params))
        self.units = wrapped.units
        self.accumulate = drain = None
        if k > 1:
            bufs, loss_buf = accumulation_buffers(plans, self.params, wrapped._tag)
            self.accumulate, drain = Accumulate(bufs, loss_buf), Drain(bufs, loss_buf)
        if self.units is not None and mode == "jit":
            self.units.make_islands()
        self.update = hsdp_update(wrapped, optimizer, max_grad_norm, norm_groups, norm_weights, step_guard, k, drain)
        self.steps: Dict[int, Tuple[Callable, Callable]] = {}   # by batch length: (micro_step, full_step)
        self.grad_norm = None   # the last optimizer step's global norm (before clipping), when clipping

    def _build(self, n: int):
        grad_fn, update, accumulate = self.grad_fn, self.update, self.accumulate
        if self.units is not None:   # level3 per unit: the forward/backward changes parameter shapes
            return self._build_per_unit(n)

        def micro_step(*args):
            loss, grads = grad_fn(*args[:n])
            return accumulate(grads, loss)

        def full_step(*args):
            loss, grads = grad_fn(*args[:n])
            return update(grads, loss)

        if self.mode == "jit":
            model = [self.wrapped.network]
            return compile_blocking(micro_step, cells=model), compile_blocking(full_step, cells=model)
        return micro_step, full_step

    def _build_per_unit(self, n: int):
        grad_fn, accumulate, units, jit, update = self.grad_fn, self.accumulate, self.units, self.mode == "jit", self.update

        def finish(grads, loss, *params):   # the parameters as arguments: read at every call
            return update(grads, loss)

        def add(grads, loss):
            return accumulate(grads, loss)
        finish = compile_blocking(finish) if jit else finish
        add = compile_blocking(add) if (jit and accumulate is not None) else add

        def gradients(args):
            units.reset_peak()
            loss, grads = grad_fn(*args[:n])
            units.check_closed()
            # a plain tuple of Tensors is a constant to ms.jit: recompiled at every call
            return (ms.mutable(tuple(grads)) if jit else grads), loss

        def micro_step(*args):
            return add(*gradients(args))

        def full_step(*args):
            return finish(*gradients(args), *self.params)
        return micro_step, full_step

    def __call__(self, *batch):
        fns = self.steps.get(len(batch))
        if fns is None:
            fns = self.steps[len(batch)] = self._build(len(batch))
        micro_step, full_step = fns
        if self.units is not None and self.wrapped.holds_full_params:
            raise RuntimeError("hsdp level3: the train step runs on the shards (each unit gathers its own "
                               "weights); call it outside `with wrapped.unsharded():`")
        if self.micro < self.k - 1:
            self.micro += 1
            return micro_step(*batch, *self.params)
        self.micro = 0
        loss, norm, _ = full_step(*batch, *self.params)
        self.grad_norm = norm if self.update.clip is not None else None
        return loss
