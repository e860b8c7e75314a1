"""Redistribution plans: NumPy execution equals slicing the global array for the target layout
(hundreds of random layout pairs on 2-D and 3-D meshes), and each transition's cheapest plan."""
import numpy as np
import pytest

from mindformers_core.sharding import Layout, apply_plan_numpy, plan_redistribution

MESHES = [((2, 2), ("dp", "tp")), ((2, 4), ("dp", "tp")), ((4, 2), ("a", "b")),
          ((2, 2, 2), ("pp", "dp", "tp")), ((2, 1, 3), ("x", "y", "z"))]


def random_layout(rng, device_matrix, alias, ndim, allow_partial):
    base = Layout(device_matrix, alias)
    dims = [[] for _ in range(ndim)]
    partial = []
    for axis in alias:
        choice = rng.integers(0, ndim + 2)
        if choice < ndim:
            dims[choice].append(axis)
        elif choice == ndim and allow_partial:
            partial.append(axis)
    for d in dims:
        rng.shuffle(d)
    layout = base(*[tuple(d) if len(d) > 1 else (d[0] if d else "None") for d in dims])
    return layout.with_partial(partial) if partial else layout


def shards_of(layout, global_array, rng):
    """Per-rank shards of ``global_array``. Partial axes hold random addends that sum to it; the
    addends depend only on the partial coordinates, so replicas stay identical."""
    addends = {}
    if layout.partial:
        combos = [()]
        for a in layout.partial:
            combos = [c + (i,) for c in combos for i in range(layout.axis_size(a))]
        for combo in combos[1:]:
            addends[combo] = rng.standard_normal(global_array.shape)
        addends[combos[0]] = global_array - sum(addends.values())
    shards = {}
    for r in layout.rank_list:
        source = global_array
        if layout.partial:
            c = layout.coordinate(r)
            source = addends[tuple(c[a] for a in layout.partial)]
        shards[r] = source[layout.local_slice(global_array.shape, r)].copy()
    return shards


def reduce_partial(layout, shards):
    if not layout.partial:
        return shards
    groups = {}
    for r in layout.rank_list:
        c = layout.coordinate(r)
        groups.setdefault(tuple(v for k, v in c.items() if k not in layout.partial), []).append(r)
    out = {}
    for members in groups.values():
        total = sum(shards[m] for m in members)
        for m in members:
            out[m] = total
    return out


def test_random_layout_pairs_match_global_slices():
    rng = np.random.default_rng(0)
    cases = 0
    for trial in range(400):
        device_matrix, alias = MESHES[trial % len(MESHES)]
        ndim = int(rng.integers(1, 4))
        shape = tuple(int(rng.choice([8, 16, 24])) for _ in range(ndim))
        src = random_layout(rng, device_matrix, alias, ndim, allow_partial=True)
        dst = random_layout(rng, device_matrix, alias, ndim, allow_partial=trial % 3 == 0)
        try:
            src.check_shape(shape)
            dst.check_shape(shape)
        except ValueError:
            continue
        global_array = rng.standard_normal(shape)
        plan = plan_redistribution(src, dst, shape)
        out = reduce_partial(dst, apply_plan_numpy(plan, shards_of(src, global_array, rng)))
        for r in dst.rank_list:
            np.testing.assert_allclose(out[r], global_array[dst.local_slice(shape, r)], atol=1e-9,
                                       err_msg=f"{src.describe()} -> {dst.describe()} rank {r}\n{plan}")
        cases += 1
    assert cases >= 300


def _kinds(plan):
    return [s.kind for s in plan.steps]


def test_cheapest_plans_for_each_transition():
    mesh = Layout((2, 4), ("dp", "tp"))
    shape = (16, 32)
    assert _kinds(plan_redistribution(mesh("None", "tp"), mesh("None", "None"), shape)) == ["all_gather"]
    assert _kinds(plan_redistribution(mesh("None", "None"), mesh("None", "tp"), shape)) == ["slice"]
    partial = mesh("dp", "None").with_partial("tp")
    assert _kinds(plan_redistribution(partial, mesh("dp", "None"), shape)) == ["all_reduce"]
    # Partial -> Shard is one reduce-scatter, cheaper than all-reduce then slice
    assert _kinds(plan_redistribution(partial, mesh("dp", "tp"), shape)) == ["reduce_scatter"]
    # Shard(0) -> Shard(1) over the same axis is one all-to-all
    assert _kinds(plan_redistribution(mesh("tp", "None"), mesh("None", "tp"), shape)) == ["all_to_all"]
    assert plan_redistribution(mesh("dp", "tp"), mesh("dp", "tp"), shape).steps == []


def test_costs_are_ring_bytes_per_rank():
    mesh = Layout((4,), ("tp",))
    plan = plan_redistribution(mesh("tp", "None"), mesh("None", "None"), (8, 4))  # local 2x4 fp32
    assert plan.bytes_per_rank == 3 * 2 * 4 * 4
    plan = plan_redistribution(mesh("None", "None").with_partial("tp"), mesh("None", "None"), (8, 4))
    assert plan.bytes_per_rank == 2 * 3 * (8 * 4 * 4) // 4


def test_multi_axis_dim_gathers_innermost_first():
    mesh = Layout((2, 2), ("cp", "dp"))
    plan = plan_redistribution(mesh("cp_dp", "None"), mesh("None", "None"), (8, 2))
    assert [(s.kind, s.axis) for s in plan.steps] == [("all_gather", "dp"), ("all_gather", "cp")]


def test_different_ranks_add_point_to_point():
    stage0 = Layout((2,), ("tp",), rank_list=[0, 1])("tp", "None")
    stage1 = Layout((2,), ("tp",), rank_list=[2, 3])("None", "None")
    plan = plan_redistribution(stage0, stage1, (4, 4))
    assert _kinds(plan) == ["all_gather", "p2p"]
    x = np.arange(16.0).reshape(4, 4)
    out = apply_plan_numpy(plan, {0: x[:2], 1: x[2:]})
    assert set(out) == {2, 3} and all(np.array_equal(out[r], x) for r in (2, 3))


def test_bad_input():
    mesh = Layout((2, 2), ("dp", "tp"))
    with pytest.raises(ValueError, match="dim 1 of size 3 is not divisible by its split 2"):
        plan_redistribution(mesh("None", "tp"), mesh("None", "None"), (4, 3))
    with pytest.raises(ValueError, match="layout has 2 dims"):
        plan_redistribution(mesh("None", "tp"), mesh("None", "None"), (4, 4, 4))
    with pytest.raises(ValueError, match="different device matrices"):
        plan_redistribution(mesh("dp", "None"), Layout((4,), ("dp",))("dp", "None"), (4, 4))
