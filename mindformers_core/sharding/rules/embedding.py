"""gather / embedding lookup: ``out = table[ids]`` along the table's ``axis``.

Output dims: the table's dims before ``axis``, then the ids' dims, then the table's dims after.
Those keep the sharding of where they come from (hidden-sharded table -> hidden-sharded output,
batch/sequence-sharded ids -> sharded rows). For the ``embedding`` op (an atomic Cell), a table split
along the looked-up (vocab) dim gives the vocab-parallel lookup: each rank looks up only ids inside its
slice of the vocabulary (offset by the slice start) and writes zeros for the others, so the output is
partial (sum) over the vocab axes; ``result.local`` names that kernel. The plain ``gather`` op has no
kernel to run: its looked-up dim is made whole first. If the ids use an axis the table needs, the
ids (small integers) are gathered rather than the table. Partial ids or tables are reduced.
"""
from __future__ import annotations

from .common import assign, cheapest, common_mesh_layout, expect_inputs, make_layout, norm_axis
from .registry import KernelSite, LocalKernel, RuleResult, register_local_kernel, register_rule


def lookup_layouts(table, ids, tshape, ishape, axis, vocab_parallel=True):
    """``(required table, required ids, output, local kernel or None)``. ``vocab_parallel=False``: the
    looked-up dim is made whole instead (no local kernel)."""
    mesh = common_mesh_layout((table, ids))
    nt, ni = len(tshape), len(ishape)
    t_slots = [d if d < axis else (None if d == axis else d - 1 + ni) for d in range(nt)]
    i_slots = [axis + k for k in range(ni)]

    def claims(layout, slots):
        return [] if layout is None else [(s, layout.dims[d]) for d, s in enumerate(slots) if s is not None]

    candidates = []
    vocab_options = [table.dims[axis], ()] if vocab_parallel and table is not None and table.dims[axis] else [()]
    for vocab in vocab_options:
        for order in ((table, t_slots), (ids, i_slots)), ((ids, i_slots), (table, t_slots)):
            dims = assign(nt - 1 + ni, claims(*order[0]) + claims(*order[1]), reserved=vocab)
            req_t = make_layout(mesh, [vocab if s is None else dims[s] for s in t_slots])
            req_i = make_layout(mesh, [dims[s] for s in i_slots])
            candidates.append(((req_t, req_i), make_layout(mesh, dims, {a: "sum" for a in vocab}), vocab))
    (req_t, req_i), out, vocab = cheapest(candidates, (table, ids), (tshape, ishape))
    kernel = None
    if vocab:
        kernel = LocalKernel("vocab_parallel_lookup", {"vocab_axes": vocab, "vocab_dim": axis,
                                                       "vocab_size": tshape[axis],
                                                       "local_vocab_size": req_t.local_shape(tshape)[axis]})
    return req_t, req_i, out, kernel


@register_rule("gather")
def gather(layouts, shapes, *, axis=0):
    """``gather(params, indices, axis)`` (MindSpore's argument order). A plain op in model code, not an atomic
    Cell, so it cannot run the vocab-parallel kernel: a params tensor split along ``axis`` is gathered whole
    there first (e.g. multi-token prediction's shift along a sequence split by sequence parallelism)."""
    expect_inputs(layouts, 2)
    a = norm_axis(axis, len(shapes[0]))
    req_t, req_i, out, kernel = lookup_layouts(layouts[0], layouts[1], shapes[0], shapes[1], a, vocab_parallel=False)
    return RuleResult((out,), (req_t, req_i), kernel)


@register_rule("embedding")
def embedding(layouts, shapes, *, padding_idx=None):
    """``embedding(ids, weight)`` with weight ``(vocab, hidden)``."""
    expect_inputs(layouts, 2)
    req_t, req_i, out, kernel = lookup_layouts(layouts[1], layouts[0], shapes[1], shapes[0], 0)
    return RuleResult((out,), (req_i, req_t), kernel)


@register_local_kernel("vocab_parallel_lookup")
def vocab_parallel_lookup_kernel(site: KernelSite):
    """The lookup on this rank's slice of the table's vocabulary (``local_kernels.VocabParallelLookup``)."""
    from ..local_kernels import VocabParallelLookup
    table_pos = 1 if site.node.op == "embedding" else 0
    layout = site.result.inputs[table_pos]
    start = layout.shard_index(0, site.rank) * layout.local_shape(site.input_shape(table_pos))[0]
    weight_attr = [n for n in getattr(site.cell, "sharding_params", ("weight",))
                   if getattr(site.cell, n, None) is not None][0]
    return VocabParallelLookup(site.cell, weight_attr, start, site.attrs["local_vocab_size"])
