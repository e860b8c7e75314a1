"""cross_entropy(logits, labels): logits ``(N, C)`` or ``(N, C, d1, ...)`` with the classes in dim 1
(MindSpore's convention), labels the class indices ``(N, d1, ...)``.

Labels follow the logits' token dims (they are small; a token dim sharded on one side only is
sliced on the other, which is free). Partial logits are reduced first.

If the class (vocab) dim is sharded, the rule keeps it sharded and returns the vocab-parallel
kernel in ``result.local`` (``vocab_parallel_cross_entropy``). That kernel reduces *inside* the
op, over the vocab axes: all-reduce max of the local row maxima, all-reduce sum of the local
``sum(exp(logit - max))``, all-reduce sum of the target logit (each rank contributes it only if
the label falls in its vocab slice); then ``loss = log(sumexp) + max - target``. The returned
loss layout is therefore *not* partial over the vocab axes. With ``reduction='none'`` the loss
has the labels' layout; with ``'sum'`` / ``'mean'`` it is a scalar, partial (``sum`` / ``avg``)
over the axes that split the tokens. ``'mean'`` as ``avg`` is exact only when every shard counts
the same tokens, so ``ignore_index`` with ``'mean'`` on sharded tokens is refused: use
``reduction='none'``, then ``sum(loss * mask) / sum(mask)``.
"""
from __future__ import annotations

from .common import common_mesh_layout, expect_inputs, make_layout
from .elementwise import broadcast_rule
from .registry import KernelError, KernelSite, LocalKernel, RuleError, RuleResult, register_local_kernel, register_rule


@register_rule("cross_entropy", "softmax_cross_entropy")
def cross_entropy(layouts, shapes, *, reduction="mean", ignore_index=None, label_smoothing=0.0):
    expect_inputs(layouts, 2)
    (logits, labels), (ls, ts) = layouts, shapes
    if reduction not in ("mean", "sum", "none"):
        raise RuleError(f"reduction={reduction!r}; valid values are 'mean', 'sum', 'none'")
    if len(ls) < 2 or tuple(ts) != ls[:1] + ls[2:]:
        raise RuleError(f"logits of shape {ls} need the classes in dim 1 and labels of shape "
                        f"{ls[:1] + ls[2:]}, got labels of shape {ts}")
    mesh = common_mesh_layout(layouts)
    vocab = logits.dims[1] if logits is not None else ()
    token_logits = None if logits is None else make_layout(mesh, logits.dims[:1] + logits.dims[2:])
    tokens = broadcast_rule((token_logits, labels), (ts, ts), "none", reserved=vocab).output
    required_logits = make_layout(mesh, tokens.dims[:1] + (vocab,) + tokens.dims[1:])
    kernel = None
    if vocab:
        if label_smoothing:
            raise RuleError(f"label_smoothing={label_smoothing} with the class dim split over {list(vocab)} "
                            f"is not supported; gather the logits' class dim first")
        kernel = LocalKernel("vocab_parallel_cross_entropy", {
            "vocab_axes": vocab, "class_dim": 1, "vocab_size": ls[1],
            "local_vocab_size": required_logits.local_shape(ls)[1],
            "collectives": (("all_reduce", "max", vocab), ("all_reduce", "sum", vocab),
                            ("all_reduce", "sum", vocab))})
    if reduction == "none":
        out = tokens
    else:
        split = tuple(a for axes in tokens.dims for a in axes)
        if reduction == "mean" and split and ignore_index is not None:
            raise RuleError(f"reduction='mean' with ignore_index={ignore_index} over tokens split on "
                            f"{list(split)} is not an average of equal shards; use reduction='none', then "
                            f"sum(loss * mask) / sum(mask)")
        out = make_layout(mesh, (), {a: "avg" if reduction == "mean" else "sum" for a in split})
    return RuleResult((out,), (required_logits, tokens), kernel)


@register_rule("cross_entropy_last_dim")
def cross_entropy_last_dim(layouts, shapes, *, reduction="mean", ignore_index=None, label_smoothing=0.0):
    """``cross_entropy`` with the classes in the LAST dim of the logits (``(b, s, V)`` language-model
    logits, labels ``(b, s)``): the same rule with the class dim moved."""
    expect_inputs(layouts, 2)
    (logits, labels), (ls, ts) = layouts, shapes
    if len(ls) < 2 or tuple(ts) != tuple(ls[:-1]):
        raise RuleError(f"logits of shape {ls} need the classes in the last dim and labels of shape "
                        f"{tuple(ls[:-1])}, got labels of shape {ts}")
    nd = len(ls)
    perm = (0, nd - 1) + tuple(range(1, nd - 1))           # (..., V) -> (N, V, ...)
    moved = None if logits is None else make_layout(common_mesh_layout(layouts), [logits.dims[p] for p in perm],
                                                     dict(logits.partial))
    res = cross_entropy((moved, labels), (tuple(ls[p] for p in perm), ts), reduction=reduction,
                        ignore_index=ignore_index, label_smoothing=label_smoothing)
    req = res.inputs[0]
    back = [None] * nd
    for k, p in enumerate(perm):
        back[p] = req.dims[k]
    required_logits = make_layout(req, back, dict(req.partial))
    local = res.local
    if local is not None:
        local.attrs["class_dim"] = nd - 1
    return RuleResult(res.outputs, (required_logits, res.inputs[1]), local)


@register_local_kernel("vocab_parallel_cross_entropy")
def vocab_parallel_cross_entropy_kernel(site: KernelSite):
    """Cross-entropy over this rank's slice of the classes (``local_kernels.VocabParallelCrossEntropyKernel``)."""
    from ..dtensor import device_mesh_of
    from ..local_kernels import VocabParallelCrossEntropyKernel
    layout, shape, class_dim = site.result.inputs[0], site.input_shape(0), site.attrs["class_dim"]
    if class_dim != len(shape) - 1:
        raise KernelError("the vocab-parallel cross-entropy kernel needs the classes in the last dim "
                          "(rule 'cross_entropy_last_dim')")
    start = layout.shard_index(class_dim, site.rank) * layout.local_shape(shape)[class_dim]
    group = device_mesh_of(layout).get_group(tuple(site.attrs["vocab_axes"]))
    return VocabParallelCrossEntropyKernel(group, start, site.attrs["local_vocab_size"],
                                           site.node.attrs.get("reduction", "mean"))
