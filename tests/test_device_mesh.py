"""DeviceMesh arithmetic (no process group) and its agreement with RankGenerator."""
import pytest

from mindformers_core.distributed import DeviceMesh, RankGenerator, get_mesh, set_mesh
from mindformers_core.distributed.parallel_state import ModelParallelState


def test_coordinates_and_groups_row_major():
    mesh = DeviceMesh((2, 3), ("dp", "tp"), rank=4)
    assert mesh.get_coordinate() == (1, 1)
    assert mesh.get_local_rank("tp") == 1 and mesh.get_local_rank("dp") == 1
    assert mesh.group_ranks("tp") == [3, 4, 5]
    assert mesh.group_ranks("dp") == [1, 4]
    assert mesh.group_ranks(("dp", "tp")) == [0, 1, 2, 3, 4, 5]
    assert mesh.all_group_ranks("dp") == [[0, 3], [1, 4], [2, 5]]
    assert mesh.size_of("tp") == 3 and mesh.size == 6


def test_sub_mesh_for_calling_rank():
    mesh = DeviceMesh((2, 2, 2), ("pp", "dp", "tp"), rank=5)
    sub = mesh["dp", "tp"]
    assert sub.shape == (2, 2) and sub.dim_names == ("dp", "tp")
    assert list(sub.rank_list) == [4, 5, 6, 7]
    assert sub.get_coordinate() == (0, 1)
    assert list(mesh["tp"].rank_list) == [4, 5]
    assert list(mesh["pp"].rank_list) == [1, 5]


def test_custom_rank_list():
    mesh = DeviceMesh((2, 2), ("dp", "tp"), rank_list=[4, 5, 6, 7], rank=6)
    assert mesh.get_coordinate() == (1, 0)
    assert mesh.group_ranks("tp") == [6, 7]


def test_mesh_groups_equal_rank_generator_groups():
    state = ModelParallelState(world_size=24, rank=0, tensor_model_parallel_size=2,
                               pipeline_model_parallel_size=4, order="tp-dp-pp")
    gen = RankGenerator(tp=2, ep=1, dp=3, pp=4, cp=1, order="tp-dp-pp")
    for token in ("tp", "dp", "pp", "tp-dp", "tp-pp", "dp-pp"):
        dims = tuple(reversed(token.split("-")))  # mesh dims run slowest-first
        assert state.mesh.all_group_ranks(dims) == gen.get_ranks(token), token


@pytest.mark.parametrize("args, message", [
    (((2, 2), ("dp",)), "has 2 dims but names"),
    (((2, 0), ("dp", "tp")), "size of dim 'tp' is 0"),
    (((2, 2), ("dp", "dp")), "repeats a name"),
    (((2, 2), ("dp", "None")), "'None'"),
])
def test_bad_mesh(args, message):
    with pytest.raises(ValueError, match=message):
        DeviceMesh(*args, rank=0)


def test_bad_rank_list_and_dims():
    with pytest.raises(ValueError, match="rank_list has 3 ranks but shape=\\(2, 2\\) needs 4"):
        DeviceMesh((2, 2), ("dp", "tp"), rank_list=[0, 1, 2], rank=0)
    mesh = DeviceMesh((2, 2), ("dp", "tp"), rank=0)
    with pytest.raises(KeyError, match="unknown dim 'cp'"):
        mesh["cp"]
    with pytest.raises(ValueError, match="rank 9 is not in this mesh"):
        mesh.coordinate_of(9)


def test_default_mesh():
    set_mesh(None)
    with pytest.raises(RuntimeError, match="no default mesh"):
        get_mesh()
    mesh = DeviceMesh((1,), ("dp",), rank=0)
    set_mesh(mesh)
    assert get_mesh() is mesh
    set_mesh(None)
    with pytest.raises(TypeError, match="expected a DeviceMesh"):
        set_mesh("dp")
