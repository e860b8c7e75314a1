"""What ``parallelize`` records on a model and its parameters, read and written only through here.

``parallelize`` replaces each parameter by this rank's shard and records on it its global layout,
its global shape and the mesh axes its gradient must still be summed over; on the model, the
sharding plan. Other packages (optim's clipping weights, hsdp, the trainer's checkpointing) ask
these functions instead of reading attributes, so the attribute names are this module's business.
A Cell class may set ``REPLACES_INNER_ATTR`` to True when it reads an inner Cell's weight without
calling that Cell (so no hook of the inner Cell runs): see :func:`replaces_inner`; and
``PARAMETER_ARGUMENTS_ATTR`` when it is handed a model Parameter as a call argument (a tied output layer, the
embedding table): see :func:`takes_parameter_arguments`.
"""
from __future__ import annotations

from typing import Tuple

_LAYOUT, _GLOBAL_SHAPE, _GRAD_AXES, _PLAN = "mfc_layout", "mfc_global_shape", "mfc_grad_axes", "mfc_sharding_plan"
REPLACES_INNER_ATTR = "mfc_replaces_inner"
PARAMETER_ARGUMENTS_ATTR = "mfc_parameter_arguments"


def annotate_parameter(param, layout, global_shape: Tuple[int, ...], grad_axes: Tuple[str, ...]) -> None:
    """Record what ``parallelize`` decided for ``param`` (before it becomes this rank's shard)."""
    setattr(param, _LAYOUT, layout)
    setattr(param, _GLOBAL_SHAPE, tuple(global_shape))
    setattr(param, _GRAD_AXES, tuple(grad_axes))


def is_sharded_parameter(param) -> bool:
    """True for a parameter of a model sharded by ``parallelize`` (replicated ones too)."""
    return hasattr(param, _GRAD_AXES)


def layout_of(param):
    """The global ``Layout`` of a parameter sharded by ``parallelize``; None for any other."""
    return getattr(param, _LAYOUT, None)


def global_shape_of(param) -> Tuple[int, ...]:
    """The full (unsharded) shape of a parameter; its own shape when ``parallelize`` did not shard it."""
    shape = getattr(param, _GLOBAL_SHAPE, None)
    return tuple(shape) if shape is not None else tuple(int(d) for d in param.shape)


def grad_axes_of(param) -> Tuple[str, ...]:
    """Mesh axes the parameter's gradient must still be summed over (empty when not sharded)."""
    return tuple(getattr(param, _GRAD_AXES, ()))


def set_sharding_plan(model, plan) -> None:
    setattr(model, _PLAN, plan)


def sharding_plan_of(model):
    """The ``ShardingPlan`` ``parallelize`` applied to ``model``; None when it was not parallelized."""
    return getattr(model, _PLAN, None)


def replaces_inner(cell) -> bool:
    """True when ``cell`` computes with an inner Cell's weight without calling that Cell (a parallel
    kernel swapped in around it): hooks on the inner Cell never run, so wrap ``cell`` instead."""
    return bool(getattr(cell, REPLACES_INNER_ATTR, False))


def takes_parameter_arguments(cell) -> bool:
    """True when ``cell`` owns no weight of its own but is handed a model Parameter as a call argument (the tied
    output layer, given the embedding table): a memory strategy that gathers each Cell's parameters around its
    calls (hsdp level3) must make it a unit of its own and gather the Parameters among its arguments."""
    return bool(getattr(cell, PARAMETER_ARGUMENTS_ATTR, False))
