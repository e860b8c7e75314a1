"""Mixture-of-experts ops: ``moe_router`` and ``moe_experts`` (``transformer/moe.py``).

Both act per token: every dim but the last (the tokens: batch, sequence) keeps the split it
arrives with, the hidden dim must be whole (a partial input is reduced first: both are nonlinear).

* ``moe_router(x (..., h), weight (h, E), expert_bias (E,))`` -> weights (..., k), ids (..., k),
  scores (..., E), routing map (..., E), all on the tokens' split; its parameters replicated.
* ``moe_experts(x (..., h), weights (..., k), ids (..., k), w_gate, w_up (E, h, f), w_down (E, f, h))``
  -> (..., h) on the tokens' split. The expert dim of the three weights is split over ``expert_axis``
  (``"ep"``) when the mesh has that axis with size > 1: the op then runs the expert-parallel kernel
  (``LocalKernel("expert_parallel")``: all-to-all over the ep group, ``sharding/expert_parallel.py``).
  LoRA on the experts (``peft/lora.py``) adds (A (E, in, r), B (E, r, out)) pairs after the three weights,
  split over the expert dim like them.
  The tokens must then be split over ``ep`` too (the batch over data parallel = ("edp", "ep")): each
  ep rank routes its own tokens, so an expert's gradient sums the tokens of the whole ep group, and
  is summed over the remaining token axes (edp, sequence splits) by the gradient reducer.
"""
from __future__ import annotations

from .common import common_mesh_layout, make_layout
from .registry import KernelSite, LocalKernel, RuleError, RuleResult, register_local_kernel, register_rule


@register_rule("moe_router")
def moe_router(layouts, shapes, *, num_experts=None, topk=None):
    if len(layouts) not in (2, 3):
        raise RuleError(f"expects x, weight and optionally expert_bias; got {len(layouts)} inputs")
    xs = shapes[0]
    mesh = common_mesh_layout(layouts)
    x = layouts[0]
    tokens = tuple(x.dims[:-1]) if x is not None else ((),) * (len(xs) - 1)
    if x is not None and x.dims[-1]:
        raise RuleError(f"the hidden dim of x must be whole, got it split over {list(x.dims[-1])}")
    tok = make_layout(mesh, tokens + ((),))
    weights = [make_layout(mesh, ((),) * len(s)) for s in shapes[1:]]     # gate weight, expert bias: replicated
    return RuleResult((tok, tok, tok, tok), (tok, *weights))


@register_rule("moe_experts")
def moe_experts(layouts, shapes, *, num_experts=None, capacity_factor=None, expert_axis="ep"):
    if len(layouts) < 6 or len(layouts) % 2:
        raise RuleError(f"expects x, weights, ids, w_gate, w_up, w_down and LoRA (A, B) pairs; got {len(layouts)} "
                        "inputs")
    xs, ws, ids = shapes[0], shapes[1], shapes[2]
    E = shapes[3][0]
    if tuple(ws[:-1]) != tuple(xs[:-1]) or tuple(ids) != tuple(ws):
        raise RuleError(f"x {xs}, weights {ws} and ids {ids} must share the token dims")
    mesh = common_mesh_layout(layouts)
    given = next((l for l in layouts[:3] if l is not None), None)
    tokens = tuple(given.dims[:-1]) if given is not None else ((),) * (len(xs) - 1)
    x = layouts[0]
    if x is not None and x.dims[-1]:
        raise RuleError(f"the hidden dim of x must be whole, got it split over {list(x.dims[-1])}")
    ep = expert_axis in mesh.alias_name and mesh.axis_size(expert_axis) > 1
    token_axes = [a for axes in tokens for a in axes]
    expert_dim = ()
    kernel = None
    if ep:
        if expert_axis not in token_axes:
            raise RuleError(f"the experts are split over {expert_axis!r} but the tokens ({[list(a) for a in tokens]}) "
                            f"are not: split the batch over data parallel (which contains {expert_axis!r})")
        if E % mesh.axis_size(expert_axis):
            raise RuleError(f"{E} experts are not divisible by the {expert_axis} size {mesh.axis_size(expert_axis)}")
        expert_dim = (expert_axis,)
    tok = make_layout(mesh, tokens + ((),))
    weights = tuple(make_layout(mesh, (expert_dim, (), ())) for _ in layouts[3:])
    if ep:
        local_tokens = 1
        for n in tok.local_shape(xs)[:-1]:
            local_tokens *= n
        kernel = LocalKernel("expert_parallel", {
            "axis": expert_axis, "num_experts": E, "local_experts": E // mesh.axis_size(expert_axis),
            "local_tokens": local_tokens, "topk": ws[-1], "capacity_factor": capacity_factor})
    return RuleResult((tok,), (tok, tok, tok) + weights, kernel)


@register_local_kernel("expert_parallel")
def expert_parallel_kernel(site: KernelSite):
    """The experts of this rank with the all-to-all token exchange (``expert_parallel.ExpertParallelExperts``)."""
    from ..dtensor import device_mesh_of
    from ..expert_parallel import ExpertParallelExperts
    a = site.attrs
    group = device_mesh_of(site.result.outputs[0]).get_group((a["axis"],))
    return ExpertParallelExperts(site.cell, group, a["num_experts"], a["local_tokens"], a["topk"],
                                 a["capacity_factor"])
