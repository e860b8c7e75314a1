"""Layouts: MindSpore's tensor_map convention and to_dict, placements both ways, local slices."""
import numpy as np
import pytest

from mindformers_core.sharding import Layout, Partial, Replicate, Shard, as_layout


def test_tensor_map_counts_axes_from_the_right():
    layout = Layout((2, 2, 2), ("dp", "cp", "tp"))
    assert layout("dp", "tp").tensor_map == (2, 0)
    assert layout(("cp", "dp"), "None").tensor_map == ((1, 2), -1)
    assert layout("cp_dp", "tp").tensor_map == ((1, 2), 0)  # the design's merged form


def test_to_dict_matches_mindspore():
    from mindspore.parallel import Layout as MsLayout
    for args, entries in [(((2, 2, 2), ("dp", "sp", "mp")), ("dp", "mp")),
                          (((2, 4), ("dp", "tp")), (("dp", "tp"), "None")),
                          (((8,), ("tp",)), ("None", "tp", "None"))]:
        ours = Layout(*args)(*entries).to_dict()
        theirs = MsLayout(*args)(*entries).to_dict()
        assert ours == {k: (list(v) if k == "rank_list" else v) for k, v in theirs.items()}


def test_mindspore_layout_is_accepted():
    from mindspore.parallel import Layout as MsLayout
    ms_layout = MsLayout((2, 4), ("dp", "tp"))(("dp", "tp"), "None")
    assert as_layout(ms_layout) == Layout((2, 4), ("dp", "tp"))(("dp", "tp"), "None")


def test_placements_round_trip():
    mesh = Layout((2, 2, 2), ("dp", "cp", "tp"))
    layout = mesh(("dp", "cp"), "tp").with_partial([])
    assert layout.placements() == (Shard(0), Shard(0), Shard(1))
    partial = mesh("None", "tp").with_partial("dp")
    assert partial.placements() == (Partial("sum"), Replicate(), Shard(1))
    for l in (layout, partial, mesh("None", "None"), mesh("tp", ("dp", "cp"))):
        back = Layout.from_placements((2, 2, 2), ("dp", "cp", "tp"), l.placements(), l.ndim)
        assert back.dims == l.dims and back.partial == l.partial


def test_placements_cannot_express_reversed_nesting():
    with pytest.raises(ValueError, match="cannot express"):
        Layout((2, 2), ("dp", "cp"))(("cp", "dp"), "None").placements()


def test_local_shape_and_slices_tile_the_tensor():
    layout = Layout((2, 2, 2), ("dp", "cp", "tp"))(("cp", "dp"), "tp")
    shape = (8, 6)
    assert layout.local_shape(shape) == (2, 3)
    covered = np.zeros(shape, int)
    for r in layout.rank_list:
        covered[layout.local_slice(shape, r)] += 1
    assert (covered == 1).all()  # all three axes split the tensor: every element on exactly one rank
    # rank 2 has (dp=0, cp=1, tp=0): chunk cp*2+dp = 2 of dim 0
    assert layout.local_slice(shape, 2) == (slice(4, 6), slice(0, 3))


@pytest.mark.parametrize("call, message", [
    (lambda l: l("xx", "None"), "unknown alias 'xx'"),
    (lambda l: l("dp", "dp"), "mesh axis 'dp' is used more than once"),
    (lambda l: l("dp", "tp").check_shape((4, 3), "weight"), "weight: dim 1 of size 3 is not divisible by its split 4"),
    (lambda l: l("dp", "tp").check_shape((4,), "bias"), "bias: layout has 2 dims"),
])
def test_bad_layouts(call, message):
    with pytest.raises(ValueError, match=message):
        call(Layout((2, 4), ("dp", "tp")))


def test_bad_device_matrix():
    with pytest.raises(ValueError, match="repeats a name"):
        Layout((2, 2), ("dp", "dp"))
    with pytest.raises(ValueError, match="'None'"):
        Layout((2,), ("None",))
