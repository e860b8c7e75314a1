"""Causal scaled dot-product attention ``softmax(q k^T / sqrt(d) + causal) v`` as one op.

Inputs q ``(b, n, s, d)``, k ``(b, g, s, d)`` and v ``(b, g, s, dv)`` (``g`` key/value heads, each
shared by ``n / g`` query heads; ``dv`` may differ from ``d``, as in multi-latent attention), and
optionally an additive mask ``(b, 1, s, s)``; output ``(b, s, n * dv)`` (heads merged, heads outermost).

* Batch and heads may stay split (heads on the same axes for q and k/v: tensor parallel).
* The head dim ``d`` must be whole.
* The sequence may be split over the context-parallel axis (attr ``seq_axis``, default ``"cp"``)
  only; it must be split the same way in q, k and v. Split, the op runs the context-parallel
  kernel (``LocalKernel("context_parallel_attention")``: ring / Ulysses / hybrid, see
  ``sharding/context_parallel.py``); any other axis on the sequence is gathered first.
* A mask input keeps its batch split like q's; its sequence dims stay whole. With the sequence split
  over cp the kernel takes the whole mask (storage order: the position / segment ids it is built from are
  gathered in that order) and attends each local query to the keys of the whole sequence under it
  (packed documents: a boundary may fall inside a cp chunk).
* Partial inputs are reduced (nonlinear).

``attention_mask`` (``AttentionMask``: position ids and optional segment ids ``(b, s)`` -> the
additive mask ``(b, 1, s, s)``) keeps the batch split and needs the whole sequence.
"""
from __future__ import annotations

from .common import common_mesh_layout, expect_inputs, make_layout
from .registry import KernelError, KernelSite, LocalKernel, RuleError, RuleResult, register_local_kernel, register_rule


@register_rule("scaled_dot_product_attention", "core_attention")
def scaled_dot_product_attention(layouts, shapes, *, causal=True, seq_axis="cp", algorithm="colossal",
                                 ulysses_degree=None, load_balance=True):
    expect_inputs(layouts, 3, 4)
    qs, ks, vs = shapes[:3]
    if len(qs) != 4 or len(ks) != 4 or len(vs) != 4 or tuple(ks[:3]) != tuple(vs[:3]):
        raise RuleError(f"needs q (b, n, s, d), k (b, g, s, d) and v (b, g, s, dv); got shapes {qs}, {ks}, {vs}")
    # keys of another length L than the queries' s: a step against a cache (multi-latent attention's
    # up-projected latents, kv_cache.LatentKVCache), which gives its (b, 1, s, L) mask
    cached = len(shapes) == 4 and ks[2] != qs[2]
    if len(shapes) == 4 and tuple(shapes[3]) not in ((qs[0], 1, qs[2], ks[2]), (1, 1, qs[2], ks[2])):
        raise RuleError(f"the mask must have shape (b, 1, s, L) = {(qs[0], 1, qs[2], ks[2])}; got {shapes[3]}")
    if qs[0] != ks[0] or (qs[2] != ks[2] and not cached) or qs[3] != ks[3] or qs[1] % ks[1]:
        raise RuleError(f"q {qs} and k/v {ks} disagree on batch, sequence or head dim, or {ks[1]} key/value "
                        f"heads do not divide {qs[1]} query heads")
    if not causal:
        raise RuleError("only causal attention is supported")
    mesh = common_mesh_layout(layouts[:3])
    src = next(l for l in layouts[:3] if l is not None)
    b_axes, h_axes, s_axes = src.dims[0], src.dims[1], src.dims[2]
    used = set()
    def free(axes):
        out = []
        for a in axes:
            if a in used:
                break
            out.append(a)
        used.update(out)
        return tuple(out)
    b_axes = free(b_axes)
    s_axes = () if cached else free(tuple(a for a in s_axes if a == seq_axis))
    h_axes = free(h_axes)
    split = 1
    for a in h_axes:
        split *= mesh.axis_size(a)
    if ks[1] % split:
        raise RuleError(f"{ks[1]} key/value heads are not divisible by the head split {split} (axes {list(h_axes)})")
    req = make_layout(mesh, (b_axes, h_axes, s_axes, ()))
    out = make_layout(mesh, (b_axes, s_axes, h_axes))
    if cached:
        return RuleResult((out,), (req, req, req, make_layout(mesh, (b_axes if shapes[3][0] == qs[0] else (),
                                                                    (), (), ()))))
    kernel = None
    cp = 1
    for a in s_axes:
        cp *= mesh.axis_size(a)
    ins = (req, req, req)
    if len(layouts) == 4:
        mask_batch = b_axes if shapes[3][0] == qs[0] else ()
        ins = ins + (make_layout(mesh, (mask_batch, (), (), ())),)
    if cp > 1:
        # the ring packs k and v along the head dim: a v head dim that differs from q/k's is padded to the
        # larger one by the kernel (ContextParallelAttention), so both shapes carry that width
        width = max(qs[3], vs[3])
        kernel = LocalKernel("context_parallel_attention", {
            "seq_axes": s_axes, "algorithm": algorithm, "ulysses_degree": ulysses_degree,
            "load_balance": load_balance, "local_q": req.local_shape(qs[:3] + (width,)),
            "local_kv": req.local_shape(ks[:3] + (width,)), "masked": len(layouts) == 4})
    return RuleResult((out,), ins, kernel)


@register_rule("attention_mask")
def attention_mask(layouts, shapes):
    """``(position_ids (b, s)[, segment_ids (b, s)]) -> (b, 1, s, s)``: batch split kept, sequence whole."""
    expect_inputs(layouts, 1, 2)
    if any(len(s) != 2 or tuple(s) != tuple(shapes[0]) for s in shapes):
        raise RuleError(f"needs position ids and segment ids of one shape (b, s); got {shapes}")
    mesh = common_mesh_layout(layouts)
    src = next(l for l in layouts if l is not None)
    b_axes = src.dims[0]
    req = make_layout(mesh, (b_axes, ()))
    return RuleResult((make_layout(mesh, (b_axes, (), (), ())),), (req,) * len(layouts))


@register_local_kernel("context_parallel_attention")
def context_parallel_attention_kernel(site: KernelSite):
    """Ring / Ulysses / hybrid attention over the context-parallel groups (``context_parallel``)."""
    from ..context_parallel import ContextParallelAttention, cp_groups
    from ..dtensor import device_mesh_of
    a = site.attrs
    ring, ulysses = cp_groups(device_mesh_of(site.result.inputs[0]), a["seq_axes"], a["algorithm"],
                              a["ulysses_degree"], site.rank)
    scale = getattr(site.cell, "scale", None)
    if scale is None:
        raise KernelError("the attention Cell needs a `scale` attribute (1/sqrt(head_dim))")
    if getattr(site.cell, "use_dropout", False):
        raise KernelError("attention_dropout > 0 is not supported with context parallelism")
    return ContextParallelAttention(site.cell, ring, ulysses, a["local_q"], a["local_kv"], scale, a["load_balance"],
                                    masked=a.get("masked", False))
