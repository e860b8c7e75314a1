"""NumPy references for every collective and autograd pair, given all ranks' inputs and weights.

``forward(name, xs)[i]`` is rank i's output; ``backward(name, xs, ws)[i]`` is rank i's gradient
of loss_i = <out_i, w_i> summed over ranks as each op's backward defines it.
"""
import numpy as np


def _chunks(a, n, dim):
    return np.split(a, n, axis=dim)


def forward(name, xs, src_index=None):
    n = len(xs)
    total = sum(x.astype(np.float64) for x in xs)
    if name in ("all_reduce_sum", "reduce_from_region"):
        return [total] * n
    if name == "all_reduce_avg":
        return [total / n] * n
    if name == "all_reduce_max":
        return [np.max(np.stack(xs), axis=0)] * n
    if name == "all_reduce_min":
        return [np.min(np.stack(xs), axis=0)] * n
    if name in ("all_gather_0", "gather_from_sp"):
        return [np.concatenate(xs, 0)] * n
    if name in ("all_gather_1", "gather_from_region"):
        return [np.concatenate(xs, 1)] * n
    if name in ("reduce_scatter_0", "reduce_scatter_to_sp"):
        return _chunks(total, n, 0)
    if name == "reduce_scatter_1":
        return _chunks(total, n, 1)
    if name == "all_to_all_1_0":
        return [np.concatenate([_chunks(x, n, 1)[i] for x in xs], 0) for i in range(n)]
    if name == "all_to_all_0_1":
        return [np.concatenate([_chunks(x, n, 0)[i] for x in xs], 1) for i in range(n)]
    if name == "broadcast":
        return [xs[src_index]] * n
    if name == "copy_to_region":
        return list(xs)
    if name == "scatter_to_region":
        return [_chunks(x, n, 1)[i] for i, x in enumerate(xs)]
    if name == "scatter_to_sp":
        return [_chunks(x, n, 0)[i] for i, x in enumerate(xs)]
    raise KeyError(name)


def backward(name, xs, ws, src_index=None):
    n = len(xs)
    wsum = sum(w.astype(np.float64) for w in ws)
    if name in ("all_reduce_sum", "copy_to_region"):
        return [wsum] * n
    if name == "all_reduce_avg":
        return [wsum / n] * n
    if name in ("all_reduce_max", "all_reduce_min"):
        stacked = np.stack(xs)
        ext = stacked.max(0) if name.endswith("max") else stacked.min(0)
        hits = (stacked == ext).astype(np.float64)
        return [wsum * hits[i] / hits.sum(0) for i in range(n)]
    if name == "reduce_from_region":
        return [w.astype(np.float64) for w in ws]
    if name == "all_gather_0":
        return _chunks(wsum, n, 0)
    if name == "all_gather_1":
        return _chunks(wsum, n, 1)
    if name == "gather_from_sp":
        return _chunks(wsum, n, 0)
    if name in ("reduce_scatter_0", "reduce_scatter_to_sp", "scatter_to_sp"):
        return [np.concatenate(ws, 0)] * n
    if name in ("reduce_scatter_1", "scatter_to_region"):
        return [np.concatenate(ws, 1)] * n
    if name == "gather_from_region":
        return [_chunks(w, n, 1)[i] for i, w in enumerate(ws)]
    if name == "all_to_all_1_0":
        # rank j's chunk i (split along 1) went to rank i at row-block j
        return [np.concatenate([_chunks(ws[i], n, 0)[j] for i in range(n)], 1) for j in range(n)]
    if name == "all_to_all_0_1":
        return [np.concatenate([_chunks(ws[i], n, 1)[j] for i in range(n)], 0) for j in range(n)]
    if name == "broadcast":
        return [wsum if i == src_index else np.zeros_like(wsum) for i in range(n)]
    raise KeyError(name)
