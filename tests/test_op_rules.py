"""Op sharding rules. Most tests are numeric: shard global NumPy inputs by the given layouts,
redistribute them to the layouts the rule requires (the redistribution planner, run on NumPy),
run the op on every rank's local shards, then check each rank's result against the global op's
result sliced by the output layout (after reducing the partial axes)."""
import numpy as np
import pytest

from mindformers_core.sharding import (Layout, NoRuleError, RuleError, RuleResult, apply_plan_numpy, infer,
                                       plan_redistribution, register_rule, registered_ops)
from mindformers_core.sharding.rules import broadcast_rule

MESH = Layout((2, 4), ("dp", "mp"))
MESHES = [Layout((2, 2), ("dp", "tp")), Layout((2, 4), ("dp", "mp")), Layout((2, 2, 2), ("pp", "dp", "tp"))]
REDUCE = {"sum": np.add, "avg": np.add, "max": np.maximum, "min": np.minimum}


# ---- harness -----------------------------------------------------------------------------
def groups(layout, axes):
    """Ranks that differ only along ``axes``."""
    out = {}
    for r in layout.rank_list:
        c = layout.coordinate(r)
        out.setdefault(tuple(v for k, v in c.items() if k not in axes), []).append(r)
    return list(out.values())


def all_reduce(values, layout, axes, op):
    out = {}
    for g in groups(layout, axes):
        total = REDUCE[op].reduce([values[r] for r in g])
        if op == "avg":
            total = total / len(g)
        out.update({r: total for r in g})
    return out


def make_shards(layout, x, rng):
    """Per-rank shards of ``x``; along each partial axis the ranks hold values reducing to it (the
    same values on ranks that differ only along replicated axes, as the layout promises)."""
    shards = {r: np.array(x[layout.local_slice(x.shape, r)]) for r in layout.rank_list}
    kept = set(layout.sharded_axes()) | set(layout.partial)
    for axis, op in layout.partial.items():
        noise = {}
        for g in groups(layout, (axis,)):
            key = tuple(layout.coordinate(g[0])[a] for a in sorted(kept - {axis}))
            v, n = shards[g[0]], len(g)
            z = noise.setdefault(key, [rng.standard_normal(v.shape) for _ in g])
            if op == "sum":
                vals = [v - sum(z[1:])] + z[1:]
            elif op == "avg":
                vals = [v + zi - sum(z) / n for zi in z]
            else:  # max
                vals = [v] + [v - np.abs(zi) for zi in z[1:]]
            shards.update(zip(g, vals))
    return shards


def per_rank(fn):
    """Run ``fn(rank, result, *local_inputs)`` on every rank independently."""
    def run(res, shards):
        return {r: fn(r, res, *[s[r] for s in shards]) for r in res.outputs[0].rank_list}
    return run


def check(op, layouts, arrays, reference, local=None, seed=0, **attrs):
    """Infer ``op``'s rule and prove it numerically; returns the RuleResult."""
    rng = np.random.default_rng(seed)
    arrays = [np.asarray(a) for a in arrays]
    res = infer(op, layouts, [a.shape for a in arrays], **attrs)
    shards = []
    for given, req, x in zip(layouts, res.inputs, arrays):
        s = make_shards(given if given is not None else req, x, rng)
        if given is not None and given != req:
            s = apply_plan_numpy(plan_redistribution(given, req, x.shape), s)
        shards.append(s)
    local = local or per_rank(lambda r, res, *xs: reference(*xs))
    got = local(res, shards)
    expected = reference(*arrays)
    expected = expected if isinstance(expected, tuple) else (expected,)
    for j, (layout, exp) in enumerate(zip(res.outputs, expected)):
        outs = {r: (v if isinstance(v, tuple) else (v,))[j] for r, v in got.items()}
        for axis, op_ in layout.partial.items():
            outs = all_reduce(outs, layout, (axis,), op_)
        for r in layout.rank_list:
            np.testing.assert_allclose(outs[r], exp[layout.local_slice(exp.shape, r)], atol=1e-9,
                                       err_msg=f"{res.describe()}\noutput {j} rank {r}")
    return res


def strategy(layout):
    """MindSpore's strategy notation: the split count of every dim."""
    return tuple(layout.split_count(d) for d in range(layout.ndim))


def random_layout(rng, mesh, shape, partial=("sum",)):
    """Random splits and partial axes (one partial op per layout: max and sum do not commute)."""
    dims, parts = [[] for _ in shape], {}
    op = partial[int(rng.integers(0, len(partial)))] if partial else None
    for axis, n in zip(mesh.alias_name, mesh.device_matrix):
        choice = int(rng.integers(0, len(shape) + 2))
        if choice < len(shape):
            split = n * int(np.prod([mesh.axis_size(a) for a in dims[choice]]))
            if shape[choice] % split == 0:
                dims[choice].append(axis)
        elif choice == len(shape) and partial:
            parts[axis] = op
    for d in dims:
        rng.shuffle(d)
    layout = mesh(*[tuple(d) if len(d) > 1 else (d[0] if d else "None") for d in dims])
    for axis, op in parts.items():
        layout = layout.with_partial(axis, op)
    return layout


def mm(a, b, transpose_a=False, transpose_b=False):
    return np.matmul(np.swapaxes(a, -1, -2) if transpose_a else a, np.swapaxes(b, -1, -2) if transpose_b else b)


def softmax(x, axis=-1):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


# ---- the worked example of MindSpore's sharding-propagation design ------------------------
def test_ffn_example_from_the_sharding_propagation_design():
    """dense1's MatMul configured ((2, 1), (1, 4)) on 8 devices: its Add gets ((2, 4), (4)), ReLU
    gets [2, 4], and dense2's MatMul gets [[2, 4], [4, 1]] with its output partial over the 4-axis."""
    x, w1, b1, w2, b2 = MESH("dp", "None"), MESH("None", "mp"), None, None, None
    mm1 = infer("MatMul", (x, w1), ((256, 784), (784, 64)))
    assert [strategy(l) for l in mm1.inputs] == [(2, 1), (1, 4)] and strategy(mm1.output) == (2, 4)
    add1 = infer("Add", (mm1.output, b1), ((256, 64), (64,)))
    assert [strategy(l) for l in add1.inputs] == [(2, 4), (4,)]
    relu = infer("ReLU", (add1.output,), ((256, 64),))
    assert strategy(relu.inputs[0]) == (2, 4) and strategy(relu.output) == (2, 4)
    mm2 = infer("MatMul", (relu.output, w2), ((256, 64), (64, 10)))
    assert [strategy(l) for l in mm2.inputs] == [(2, 4), (4, 1)]
    assert mm2.inputs[1] == MESH("mp", "None")
    assert mm2.output == MESH("dp", "None").with_partial("mp")
    add2 = infer("Add", (mm2.output, b2), ((256, 10), (10,)))
    assert add2.output == mm2.output and add2.inputs[1] == MESH("None").with_partial("mp")
    # every step consumes its producer's layout as is: no redistribution anywhere
    assert not any(r.redistributions() for r in (mm1, add1, relu, mm2, add2))

    # the same chain, run per rank on small NumPy shards, equals the single-device FFN
    rng = np.random.default_rng(1)
    X, W1, B1, W2, B2 = (rng.standard_normal(s) for s in [(8, 16), (16, 8), (8,), (8, 4), (4,)])
    ex = {}
    for name, arr, layout in [("x", X, mm1.inputs[0]), ("w1", W1, mm1.inputs[1]), ("b1", B1, add1.inputs[1]),
                              ("w2", W2, mm2.inputs[1]), ("b2", B2, add2.inputs[1])]:
        ex[name] = make_shards(layout, arr, rng)
    y = {r: np.maximum(ex["x"][r] @ ex["w1"][r] + ex["b1"][r], 0) @ ex["w2"][r] + ex["b2"][r]
         for r in MESH.rank_list}
    y = all_reduce(y, add2.output, ("mp",), "sum")
    full = np.maximum(X @ W1 + B1, 0) @ W2 + B2
    for r in MESH.rank_list:
        np.testing.assert_allclose(y[r], full[add2.output.local_slice(full.shape, r)], atol=1e-9)


# ---- matmul -------------------------------------------------------------------------------
def test_matmul_contracting_dim_split_on_both_sides_gives_partial_sum():
    a, b = np.arange(64.0).reshape(8, 8), np.arange(32.0).reshape(8, 4)
    res = check("matmul", (MESH("dp", "mp"), MESH("mp", "None")), (a, b), mm)
    assert res.output == MESH("dp", "None").with_partial("mp") and not res.redistributions()


def test_matmul_one_sided_contracting_split_slices_the_other_side_for_free():
    a, b = np.ones((8, 8)), np.ones((8, 4))
    res = check("matmul", (MESH("dp", "mp"), MESH("None", "None")), (a, b), mm)
    assert res.inputs == (MESH("dp", "mp"), MESH("mp", "None"))
    (i, given, required), = res.redistributions()
    assert i == 1 and [s.kind for s in plan_redistribution(given, required, (8, 4)).steps] == ["slice"]
    res = check("matmul", (MESH("dp", "None"), MESH("mp", "None")), (a, b), mm)
    assert res.inputs == (MESH("dp", "mp"), MESH("mp", "None"))


def test_matmul_axis_conflict_moves_the_cheaper_input():
    # x splits m on dp and k on mp; w splits n on mp: one of them must give mp up
    x_layout, w_layout = MESH("dp", "mp"), MESH("None", "mp")
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((64, 16)), rng.standard_normal((16, 8))
    res = check("matmul", (x_layout, w_layout), (x, w), mm)
    assert res.inputs == (x_layout, MESH("mp", "None"))           # small weight: all-to-all it
    assert res.output == MESH("dp", "None").with_partial("mp")
    x, w = rng.standard_normal((8, 16)), rng.standard_normal((16, 1024))
    res = check("matmul", (x_layout, w_layout), (x, w), mm)
    assert res.inputs == (MESH("dp", "None"), w_layout)           # huge weight: gather the small x
    assert res.output == MESH("dp", "mp")


def test_batch_matmul_transpose_flags_attention_scores():
    # q, k (B, H, S, D) with heads split: scores = q @ k^T, then probs @ v
    rng = np.random.default_rng(0)
    q, k = rng.standard_normal((2, 4, 8, 4)), rng.standard_normal((2, 4, 8, 4))
    heads = MESH("dp", "mp", "None", "None")
    res = check("batch_matmul", (heads, heads), (q, k), lambda a, b: mm(a, b, transpose_b=True),
                transpose_b=True)
    assert res.output == heads and not res.redistributions()
    # contracting the (split) sequence dim: partial over its axis; k's batch dim is sliced to match q
    res = check("BatchMatMul", (MESH("dp", "None", "mp", "None"), MESH("None", "None", "mp", "None")),
                (q, k), lambda a, b: mm(a, b, transpose_a=True), transpose_a=True)
    assert res.output == MESH("dp", "None", "None", "None").with_partial("mp")
    assert res.inputs[1] == MESH("dp", "None", "mp", "None")


def test_matmul_random_layouts_numerically():
    rng = np.random.default_rng(0)
    for trial in range(120):
        mesh = MESHES[trial % 3]
        ta, tb = bool(trial & 1), bool(trial & 2)
        batch_a = [(), (4,), (2, 4), (1, 4)][trial % 4]
        batch_b = [(), (4,), (4,), (2, 1, 4)][(trial // 4) % 4]
        m, k, n = 8, 8, 4
        sa = batch_a + ((k, m) if ta else (m, k))
        sb = batch_b + ((n, k) if tb else (k, n))
        la = random_layout(rng, mesh, sa, partial=("sum", "avg"))
        lb = random_layout(rng, mesh, sb) if trial % 5 else None
        check("matmul", (la, lb), (rng.standard_normal(sa), rng.standard_normal(sb)),
              lambda a, b: mm(a, b, ta, tb), seed=trial, transpose_a=ta, transpose_b=tb)


def test_linear_row_parallel_bias_is_added_once():
    rng = np.random.default_rng(0)
    x, w, b = rng.standard_normal((8, 16)), rng.standard_normal((4, 16)), rng.standard_normal(4)
    res = check("linear", (MESH("dp", "mp"), MESH("None", "mp"), MESH("None")), (x, w, b),
                lambda x, w, b: x @ w.T + b)
    assert res.output == MESH("dp", "None").with_partial("mp")
    assert res.inputs[2] == MESH("None").with_partial("mp")
    res = check("linear", (MESH("dp", "None"), MESH("mp", "None"), None), (x, w, b),
                lambda x, w, b: x @ w.T + b)
    assert res.output == MESH("dp", "mp") and res.inputs[2] == MESH("mp")   # column parallel
    res = check("dense", (MESH("None", "None").with_partial("dp", "avg"), MESH("mp", "None"), None), (x, w, b),
                lambda x, w, b: x @ w.T + b)
    assert res.output == MESH("None", "mp").with_partial("dp", "avg") and res.inputs[2] == MESH("mp")


# ---- elementwise and partial inputs --------------------------------------------------------
def test_broadcast_dims_are_unsharded_and_others_follow():
    x, y = np.arange(32.0).reshape(4, 8), np.arange(4.0).reshape(4, 1)
    res = check("add", (MESH("None", "mp"), MESH("dp", "None")), (x, y), np.add)
    assert res.output == MESH("dp", "mp") and res.inputs == (MESH("dp", "mp"), MESH("dp", "None"))
    res = check("mul", (MESH("dp", "mp"), None), (x, np.float64(3.0)), np.multiply)
    assert res.inputs[1] == MESH() and res.output == MESH("dp", "mp")


def test_mismatched_shardings_resolve_to_a_common_layout():
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((8, 8)), rng.standard_normal((8, 8))
    res = check("sub", (MESH("dp", "None"), MESH("None", "dp")), (x, y), np.subtract)
    assert res.inputs[0] == res.inputs[1] == res.output and len(res.redistributions()) == 1


def test_partial_inputs():
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((8, 8)), rng.standard_normal((8, 8))
    p = MESH("dp", "None").with_partial("mp")
    rep = MESH("dp", "None")
    # add of two partial sums stays partial, no communication
    res = check("add", (p, p), (x, y), np.add)
    assert res.output == p and not res.redistributions()
    # add of a partial and a replicated value: the replicated one is fed as a partial (free)
    res = check("add", (p, rep), (x, y), np.add)
    assert res.output == p and res.inputs[1] == p
    assert plan_redistribution(rep, p, (8, 8)).bytes_per_rank == 0
    # mul / div by a replicated value stays partial
    assert check("mul", (p, rep), (x, y), np.multiply).output == p
    assert check("div", (p, rep), (x, y + 5.0), np.divide).output == p
    # div by a partial, mul of two partials over one axis, nonlinear ops: reduce first
    res = check("div", (rep, p), (x, y + 5.0), np.divide)
    assert not res.output.partial and not res.inputs[1].partial
    res = check("mul", (p, p), (x, y), np.multiply)
    assert res.output == p and res.inputs[0] == p and not res.inputs[1].partial
    for op, fn in [("relu", lambda v: np.maximum(v, 0)), ("exp", np.exp), ("dropout", lambda v: v)]:
        res = check(op, (p,), (x,), fn)
        assert res.inputs[0] == res.output == rep
    # partials over different axes multiply into a partial over both
    dp_part = MESH("None", "None").with_partial("dp")
    res = check("mul", (MESH("None", "None").with_partial("mp"), dp_part), (x, y), np.multiply)
    assert res.output.partial == {"mp": "sum", "dp": "sum"}
    # a partial max is not linear: add reduces it
    res = check("add", (MESH("dp", "None").with_partial("mp", "max"), rep), (x, y), np.add)
    assert not res.output.partial
    # an average stays partial when a replicated value is added: it averages to itself
    avg = MESH("dp", "None").with_partial("mp", "avg")
    res = check("add", (avg, MESH("None", "None")), (x, y), np.add)
    assert res.output == avg and res.inputs[1] == rep
    # concat of a partial max and a replicated value stays a partial max
    pmax = MESH("dp", "None").with_partial("mp", "max")
    res = check("concat", (pmax, rep), (x, y), lambda a, b: np.concatenate([a, b], 1), axis=1)
    assert res.output == pmax and res.inputs == (pmax, rep)
    # cast keeps partials only to a float dtype
    assert check("cast", (p,), (x,), lambda v: v, dtype="float32").output == p
    assert check("cast", (p,), (x,), lambda v: v).output == rep


def test_partial_meeting_a_shard_on_the_same_axis_picks_the_cheaper_fix():
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((16, 64)), rng.standard_normal((16, 64))
    res = check("add", (MESH("dp", "None").with_partial("mp"), MESH("dp", "mp")), (x, y), np.add)
    # reduce-scatter the partial or gather the shard: both move 3 x 512 B per rank; the tie goes to
    # the candidate that leaves no reduction pending
    scatter = plan_redistribution(MESH("dp", "None").with_partial("mp"), MESH("dp", "mp"), (16, 64))
    gather = plan_redistribution(MESH("dp", "mp"), MESH("dp", "None"), (16, 64))
    assert scatter.bytes_per_rank == gather.bytes_per_rank == 1536
    assert res.output == MESH("dp", "mp") and res.inputs[0] == MESH("dp", "mp")


def test_elementwise_random_layouts_numerically():
    rng = np.random.default_rng(1)
    shapes = [((8, 8), (8, 8)), ((2, 8, 8), (8,)), ((8, 1), (1, 8)), ((4, 8), ()), ((8, 4, 8), (4, 1))]
    ops = [("add", np.add), ("sub", np.subtract), ("mul", np.multiply), ("maximum", np.maximum), ("div", None),
           ("where", None)]
    for trial in range(160):
        mesh = MESHES[trial % 3]
        sa, sb = shapes[trial % len(shapes)]
        op, fn = ops[(trial // 3) % len(ops)]
        layouts = [random_layout(rng, mesh, s, partial=("sum", "avg", "max")) if (trial + i) % 4 else None
                   for i, s in enumerate((sa, sb))]
        if layouts == [None, None]:
            layouts[0] = random_layout(rng, mesh, sa)
        if op == "div":
            check("div", layouts, (rng.standard_normal(sa), np.abs(rng.standard_normal(sb)) + 1), np.divide,
                  seed=trial)
        elif op == "where":   # where(cond, a, b) with a condition that is not partial
            cond = layouts[0] and layouts[0].without_partial()
            a, b = rng.standard_normal(sa), rng.standard_normal(sb)
            check("where", (cond,) + tuple(layouts), (a > 0, a, b), np.where, seed=trial)
        else:
            check(op, layouts, (rng.standard_normal(sa), rng.standard_normal(sb)), fn, seed=trial)


# ---- reductions ---------------------------------------------------------------------------
def test_reductions_over_a_sharded_dim_are_partial():
    x = np.random.default_rng(0).standard_normal((8, 8))
    layout = MESH("dp", "mp")
    assert check("sum", (layout,), (x,), lambda v: v.sum(1), axis=1).output == MESH("dp").with_partial("mp")
    res = check("mean", (layout,), (x,), lambda v: v.mean(1, keepdims=True), axis=-1, keep_dims=True)
    assert res.output == MESH("dp", "None").with_partial("mp", "avg")
    res = check("ReduceMax", (layout,), (x,), lambda v: v.max(0), axis=0)
    assert res.output == MESH("mp").with_partial("dp", "max")
    assert check("sum", (layout,), (x,), lambda v: v.sum()).output == MESH().with_partial(["dp", "mp"])
    res = check("argmax", (layout,), (x,), lambda v: v.argmax(1), axis=1)
    assert res.inputs[0] == MESH("dp", "None") and res.output == MESH("dp")


def test_reductions_random_layouts_numerically():
    rng = np.random.default_rng(2)
    kinds = [("sum", np.sum, ("sum", "avg")), ("mean", np.mean, ("sum", "avg")),
             ("max", np.max, ("max", "sum")), ("min", np.min, ("sum",))]
    for trial in range(80):
        mesh = MESHES[trial % 3]
        op, fn, parts = kinds[trial % 4]
        shape = (4, 8, 8)
        axis = [None, 0, (1, 2), -1, (0, 2)][trial % 5]
        keep = bool(trial & 8)
        layout = random_layout(rng, mesh, shape, partial=parts)
        check(op, (layout,), (rng.standard_normal(shape),), lambda v: fn(v, axis=axis, keepdims=keep),
              seed=trial, axis=axis, keep_dims=keep)


# ---- softmax and norms --------------------------------------------------------------------
def test_softmax_axis_must_be_whole():
    x = np.random.default_rng(0).standard_normal((8, 8))
    res = check("softmax", (MESH("dp", "mp"),), (x,), softmax)
    assert res.inputs[0] == res.output == MESH("dp", "None")
    res = check("log_softmax", (MESH("mp", "dp"),), (x,), lambda v: np.log(softmax(v, 0)), axis=0)
    assert res.output == MESH("None", "dp")


def rms_norm(x, w):
    return x / np.sqrt((x ** 2).mean(-1, keepdims=True) + 1e-6) * w


def layer_norm(x, w, b):
    mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + 1e-5) * w + b


def test_norms_keep_sequence_parallel_and_gather_the_hidden_dim():
    rng = np.random.default_rng(0)
    x, w, b = rng.standard_normal((2, 8, 16)), rng.standard_normal(16), rng.standard_normal(16)
    seq = MESH("None", "mp", "None")
    res = check("rms_norm", (seq, None), (x, w), rms_norm, epsilon=1e-6)
    assert res.output == seq and res.inputs[1] == MESH("None") and not res.redistributions()
    res = check("RmsNorm", (MESH("dp", "None", "mp"), MESH("mp")), (x, w), rms_norm)
    assert res.output == MESH("dp", "None", "None") and len(res.redistributions()) == 2
    res = check("layer_norm", (MESH("dp", "mp", "None"), None, None), (x, w, b), layer_norm)
    assert res.output == MESH("dp", "mp", "None")
    assert check("rms_norm", (seq.with_partial("dp"), None), (x, w), rms_norm).output == seq


def rotary(x, cos, sin):
    half = x.shape[-1] // 2
    rot = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos + rot * sin


def test_rotary_embedding_shards_sequence_not_head_dim():
    rng = np.random.default_rng(0)
    x, ang = rng.standard_normal((2, 4, 8, 8)), rng.standard_normal((8, 8))   # (B, H, S, D), (S, D)
    cos, sin = np.cos(ang), np.sin(ang)
    bhsd = MESH("dp", "None", "mp", "None")
    res = check("rotary_embedding", (bhsd, None, None), (x, cos, sin), rotary)
    assert res.output == bhsd and res.inputs[1] == res.inputs[2] == MESH("mp", "None")
    res = check("rotary_embedding", (MESH("dp", "mp", "None", "None"), MESH("None", "None"),
                                     MESH("None", "None")), (x, cos, sin), rotary)
    assert res.output == MESH("dp", "mp", "None", "None")
    res = check("rotary_embedding", (MESH("dp", "None", "None", "mp"), None, None), (x, cos, sin), rotary)
    assert res.inputs[0] == MESH("dp", "None", "None", "None")
    p = MESH("dp", "None", "None", "None").with_partial("mp")
    assert check("rotary_embedding", (p, None, None), (x, cos, sin), rotary).output == p   # linear in x


# ---- shape ops ----------------------------------------------------------------------------
def local_reshape(r, res, x):
    return x.reshape(res.local.attrs["shape"])


@pytest.mark.parametrize("src, dst, given, required, out", [
    # merge: the outermost dim keeps its split; an inner split is gathered
    ((8, 4, 6), (8, 24), ("dp", "mp", "None"), ("dp", "mp", "None"), ("dp", "mp")),
    ((8, 4, 6), (8, 24), ("None", "None", "dp"), ("None", "None", "None"), ("None", "None")),
    # split: the outermost new dim takes the split if divisible, else the dividing prefix of its axes
    ((4, 16), (4, 4, 4), ("None", "mp"), ("None", "mp"), ("None", "mp", "None")),
    ((4, 16), (4, 2, 8), ("None", ("dp", "mp")), ("None", "dp"), ("None", "dp", "None")),
    ((4, 16), (4, 2, 8), ("None", "mp"), ("None", "None"), ("None", "None", "None")),
    ((2, 8, 32), (2, 8, 4, 8), ("dp", "None", "mp"), ("dp", "None", "mp"), ("dp", "None", "mp", "None")),
    # regroup (6, 8) -> (8, 6), and size-1 dims
    ((6, 8), (8, 6), ("dp", "None"), ("dp", "None"), ("dp", "None")),
    ((8, 1, 8), (8, 8), ("None", "None", "mp"), ("None", "None", "mp"), ("None", "mp")),
])
def test_reshape_split_and_merge(src, dst, given, required, out):
    x = np.arange(np.prod(src), dtype=float).reshape(src)
    res = check("reshape", (MESH(*given),), (x,), lambda v: v.reshape(dst), local=per_rank(local_reshape),
                shape=dst)
    assert res.inputs[0] == MESH(*required) and res.output == MESH(*out)


def test_reshape_random_layouts_numerically():
    rng = np.random.default_rng(3)
    pairs = [((8, 8), (64,)), ((8, 8), (2, 4, 8)), ((4, 8, 2), (32, 2)), ((16, 4), (4, 4, 4)),
             ((8, 6), (4, 12)), ((2, 8, 8), (2, 8, -1, 4))]
    for trial in range(60):
        src, dst = pairs[trial % len(pairs)]
        mesh = MESHES[trial % 3]
        layout = random_layout(rng, mesh, src, partial=("sum", "max"))
        x = rng.standard_normal(src)
        check("view", (layout,), (x,), lambda v: v.reshape(dst), local=per_rank(local_reshape), seed=trial,
              shape=dst)


def test_flatten_squeeze_expand_transpose_keep_shards():
    x = np.arange(2 * 8 * 4.0).reshape(2, 8, 4)
    res = check("flatten", (MESH("dp", "mp", "None"),), (x,), lambda v: v.reshape(len(v), -1))
    assert res.output == MESH("dp", "mp")
    res = check("expand_dims", (MESH("dp", "mp", "None"),), (x,), lambda v: v[:, None], axis=1)
    assert res.output == MESH("dp", "None", "mp", "None")
    res = check("squeeze", (res.output,), (x[:, None],), lambda v: v[:, 0], axis=1)
    assert res.output == MESH("dp", "mp", "None")
    p = MESH("dp", "mp", "None")
    res = check("transpose", (p,), (x,), lambda v: v.transpose(2, 0, 1), perm=(2, 0, 1))
    assert res.output == MESH("None", "dp", "mp")
    res = check("transpose", (MESH("None", "mp", "None").with_partial("dp"),), (x,), lambda v: v.swapaxes(1, 2),
                dim0=1, dim1=2)
    assert res.output == MESH("None", "None", "mp").with_partial("dp")


def test_tril_needs_the_last_two_dims_whole():
    x = np.arange(2 * 8 * 8.0).reshape(2, 8, 8)
    res = check("tril", (MESH("dp", "mp", "None"),), (x,), np.tril)
    assert res.inputs[0] == res.output == MESH("dp", "None", "None")
    res = check("triu", (MESH("None", "None", "None").with_partial("mp"),), (x,), lambda v: np.triu(v, 1),
                diagonal=1)
    assert res.output.partial == {"mp": "sum"}


def test_broadcast_to_and_repeat_interleave_for_grouped_query_attention():
    kv = np.arange(2 * 4 * 8 * 2.0).reshape(2, 4, 8, 2)   # (B, kv heads, S, D)
    res = check("repeat_interleave", (MESH("dp", "mp", "None", "None"),), (kv,), lambda v: np.repeat(v, 2, 1),
                repeats=2, axis=1)
    assert res.output == MESH("dp", "mp", "None", "None")
    x = np.arange(8.0).reshape(8, 1)
    res = check("broadcast_to", (MESH("dp", "None"),), (x,), lambda v: np.broadcast_to(v, (4, 8, 4)),
                local=per_rank(lambda r, res, v: np.broadcast_to(v, res.local.attrs["shape"])), shape=(4, 8, 4))
    assert res.output == MESH("None", "dp", "None")


def test_split_concat_slice():
    x = np.arange(8 * 12.0).reshape(8, 12)
    res = check("split", (MESH("dp", "mp"),), (x,), lambda v: tuple(np.split(v, 2, axis=0)),
                axis=0, output_num=2)
    assert res.inputs[0] == MESH("None", "mp") and res.outputs == (MESH("None", "mp"),) * 2
    res = check("split", (MESH("dp", "None"),), (x,), lambda v: tuple(np.split(v, [4, 6], axis=1)),
                axis=1, split_size_or_sections=[4, 2, 6])
    assert res.outputs == (MESH("dp", "None"),) * 3 and not res.redistributions()
    y = np.arange(8 * 4.0).reshape(8, 4)
    p = MESH("dp", "None").with_partial("mp")
    res = check("concat", (p, MESH("None", "None").with_partial("mp")), (x, y),
                lambda a, b: np.concatenate([a, b], 1), axis=1)
    assert res.output == p
    res = check("cat", (MESH("dp", "mp"), MESH("None", "mp")), (x, y), lambda a, b: np.concatenate([a, b], 1),
                dim=-1)
    assert res.output == MESH("dp", "None")

    def local_slice(r, res, v):
        k = res.local.attrs
        return v[tuple(slice(b, e, s) for b, e, s in zip(k["begin"], k["end"], k["strides"]))]
    res = check("strided_slice", (MESH("dp", "mp"),), (x,), lambda v: v[:, 1:9:2], local=per_rank(local_slice),
                begin=(0, 1), end=(8, 9), strides=(1, 2))
    assert res.output == MESH("dp", "None")
    res = check("slice", (MESH("dp", "mp"),), (x,), lambda v: v[2:6], local=per_rank(local_slice),
                begin=(2, 0), size=(4, -1))
    assert res.output == MESH("None", "mp")


# ---- embedding and loss -------------------------------------------------------------------
def vocab_parallel_lookup(r, res, ids, table):
    k = res.local.attrs
    start = res.inputs[1].shard_index(0, r) * k["local_vocab_size"]
    inside = (ids >= start) & (ids < start + k["local_vocab_size"])
    return table[np.where(inside, ids - start, 0)] * inside[..., None]


def test_embedding_vocab_parallel_is_partial_sum_with_masking():
    rng = np.random.default_rng(0)
    ids, table = rng.integers(0, 16, (4, 6)), rng.standard_normal((16, 8))
    res = check("embedding", (MESH("dp", "None"), MESH("mp", "None")), (ids, table), lambda i, t: t[i],
                local=per_rank(vocab_parallel_lookup))
    assert res.output == MESH("dp", "None", "None").with_partial("mp")
    assert res.local.name == "vocab_parallel_lookup" and res.local.attrs["vocab_axes"] == ("mp",)
    # sequence-parallel ids on the vocab axis: the ids are gathered, not the table
    res = check("embedding", (MESH("dp", "mp"), MESH("mp", "None")), (ids[:, :4], table), lambda i, t: t[i],
                local=per_rank(vocab_parallel_lookup))
    assert res.inputs == (MESH("dp", "None"), MESH("mp", "None"))
    # hidden-sharded table: hidden-sharded output, plain local lookup
    res = check("gather", (MESH("None", "mp"), MESH("dp", "None")), (table, ids), lambda t, i: t[i], axis=0)
    assert res.output == MESH("dp", "None", "mp") and res.local is None
    # the plain gather op cannot run the vocab-parallel kernel: a params split along its axis is made whole
    # (multi-token prediction's shift of a sequence-parallel activation, issue 32)
    x, shift = rng.standard_normal((4, 8, 8)), np.array([1, 2, 3, 4, 5, 6, 7, 7])
    res = check("gather", (MESH("dp", "mp", "None"), None), (x, shift), lambda t, i: t[:, i], axis=1)
    assert res.inputs[0] == MESH("dp", "None", "None") and res.local is None


def vocab_parallel_cross_entropy(reduction):
    def run(res, shards):
        logits, labels = shards
        layout, k = res.inputs[0], res.local.attrs
        axes, lv = k["vocab_axes"], k["local_vocab_size"]
        m = all_reduce({r: v.max(1) for r, v in logits.items()}, layout, axes, "max")
        se = all_reduce({r: np.exp(v - m[r][:, None]).sum(1) for r, v in logits.items()}, layout, axes, "sum")
        tgt = {}
        for r, v in logits.items():
            start = layout.shard_index(1, r) * lv
            inside = (labels[r] >= start) & (labels[r] < start + lv)
            idx = np.where(inside, labels[r] - start, 0)
            tgt[r] = np.take_along_axis(v, idx[:, None], 1)[:, 0] * inside
        tgt = all_reduce(tgt, layout, axes, "sum")
        loss = {r: np.log(se[r]) + m[r] - tgt[r] for r in logits}
        return {r: {"none": v, "sum": v.sum(), "mean": v.mean()}[reduction] for r, v in loss.items()}
    return run


def cross_entropy(reduction):
    def ref(logits, labels):
        m = logits.max(1, keepdims=True)
        loss = np.log(np.exp(logits - m).sum(1)) + m[:, 0] - logits[np.arange(len(labels)), labels]
        return {"none": loss, "sum": loss.sum(), "mean": loss.mean()}[reduction]
    return ref


@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
def test_cross_entropy_vocab_parallel(reduction):
    rng = np.random.default_rng(0)
    logits, labels = rng.standard_normal((8, 16)) * 3, rng.integers(0, 16, 8)
    res = check("cross_entropy", (MESH("dp", "mp"), None), (logits, labels), cross_entropy(reduction),
                local=vocab_parallel_cross_entropy(reduction), reduction=reduction)
    assert res.local.name == "vocab_parallel_cross_entropy"
    assert res.inputs[1] == MESH("dp")
    expected = {"none": MESH("dp"), "sum": MESH().with_partial("dp"), "mean": MESH().with_partial("dp", "avg")}
    assert res.output == expected[reduction]   # not partial over the vocab axis: the kernel reduced it


def test_cross_entropy_unsharded_vocab_runs_locally():
    rng = np.random.default_rng(0)
    logits, labels = rng.standard_normal((8, 16)), rng.integers(0, 16, 8)
    res = check("cross_entropy", (MESH("None", "None").with_partial("mp"), MESH("dp")), (logits, labels),
                cross_entropy("sum"), reduction="sum")
    assert res.local is None and res.inputs[0] == MESH("dp", "None") and res.output == MESH().with_partial("dp")


# ---- registry, extension and errors -------------------------------------------------------
@register_rule("test_only_scaled_softplus")
def _scaled_softplus(layouts, shapes, *, beta=1.0):
    return broadcast_rule(layouts, shapes, "none")


def test_a_new_op_is_one_small_function():
    res = check("test_only_scaled_softplus", (MESH("dp", "None").with_partial("mp"),), (np.ones((4, 4)),),
                lambda v: np.log1p(np.exp(v)), beta=2.0)
    assert isinstance(res, RuleResult) and res.output == MESH("dp", "None")
    for op in ["matmul", "add", "sum", "mean", "max", "softmax", "log_softmax", "reshape", "transpose", "split",
               "concat", "slice", "gather", "embedding", "rms_norm", "layer_norm", "rotary_embedding",
               "cross_entropy", "cast", "dropout", "silu", "gelu"]:
        assert any(op.replace("_", "") == o.replace("_", "").lower() for o in registered_ops()), op


def test_unknown_op_names_the_op_and_its_input_layouts():
    with pytest.raises(NoRuleError, match=r"no sharding rule for op 'flash_attention' "
                                          r"\(input 0: \(dp, None\) partial\{mp:sum\} .*undecided shape \(8,\)"
                                          r".*register_rule"):
        infer("flash_attention", (MESH("dp", "None").with_partial("mp"), None), ((8, 8), (8,)))


def test_bad_input_names_op_input_and_dims():
    with pytest.raises(RuleError, match=r"matmul: input 1: dim 0 of size 6 is not divisible by its split 4"):
        infer("matmul", (MESH("dp", "None"), MESH("mp", "None")), ((8, 6), (6, 4)))
    with pytest.raises(RuleError, match=r"add: input 0: layout has 2 dims \(\(dp, mp\)\) "
                                        r"but the tensor has shape \(8, 8, 8\)"):
        infer("add", (MESH("dp", "mp"), None), ((8, 8, 8), (8,)))
    with pytest.raises(RuleError, match=r"matmul \(input 0: \(dp, None\) shape \(8, 6\).*"
                                        r"contracting dims differ: input 0 dim 1 has size 6, "
                                        r"input 1 dim 0 has size 8"):
        infer("matmul", (MESH("dp", "None"), None), ((8, 6), (8, 4)))
    with pytest.raises(RuleError, match=r"mul .*do not broadcast"):
        infer("mul", (MESH("dp", "None"), None), ((8, 4), (8, 3)))
    with pytest.raises(RuleError, match=r"softmax: .*unexpected keyword argument 'axes'.*valid attributes: "
                                        r"\['axis', 'dim'\]"):
        infer("softmax", (MESH("dp", "None"),), ((8, 4),), axes=1)
    with pytest.raises(RuleError, match=r"different device meshes"):
        infer("add", (MESH("dp", "None"), Layout((8,), ("tp",))("tp", "None")), ((8, 8), (8, 8)))
    with pytest.raises(RuleError, match=r"relu .*no input has a layout yet"):
        infer("relu", (None,), ((8,),))
    with pytest.raises(RuleError, match=r"sum .*axis=2 is out of range for a 2-dim input"):
        infer("sum", (MESH("dp", "None"),), ((8, 4),), axis=2)
    with pytest.raises(RuleError, match=r"reshape .*cannot reshape \(8, 4\) \(32 elements\) to \(5, 6\)"):
        infer("reshape", (MESH("dp", "None"),), ((8, 4),), shape=(5, 6))
    with pytest.raises(RuleError, match=r"rms_norm .*input 1 of shape \(8,\) does not match the "
                                        r"normalized dims"):
        infer("rms_norm", (MESH("dp", "None"), None), ((8, 4), (8,)))
    with pytest.raises(RuleError, match=r"ignore_index=-100 over tokens split on \['dp'\]"):
        infer("cross_entropy", (MESH("dp", "mp"), None), ((8, 16), (8,)), ignore_index=-100)
    with pytest.raises(RuleError, match=r"labels of shape \(8,\), got labels of shape \(4,\)"):
        infer("cross_entropy", (MESH("dp", "mp"), None), ((8, 16), (4,)))
    with pytest.raises(ValueError, match=r"op 'add' already has a rule"):
        register_rule("add")(lambda layouts, shapes: None)
