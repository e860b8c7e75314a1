"""Model-parallel state: layout math without communication, errors before any group exists,
and the single-process fallback."""
import pytest

from mindformers_core.distributed import parallel_state as ps
from mindformers_core.distributed.parallel_state import ModelParallelState


def test_layout_for_one_rank_of_24():
    state = ModelParallelState(world_size=24, rank=9, tensor_model_parallel_size=2,
                               pipeline_model_parallel_size=4, order="tp-dp-pp")
    assert state.dp == 3
    assert state.ranks("tp") == [8, 9]
    assert state.ranks("dp") == [7, 9, 11]
    assert state.ranks("pp") == [3, 9, 15, 21]
    assert state.ranks("tp-pp") == [2, 3, 8, 9, 14, 15, 20, 21]
    assert state.embedding_ranks() == [3, 21]


def test_expert_layout_uses_its_own_generator():
    state = ModelParallelState(world_size=8, rank=3, tensor_model_parallel_size=2,
                               expert_model_parallel_size=2)
    assert state.dp == 4
    assert state.ranks("ep", "expert") == [1, 3]
    assert state.ranks("dp", "expert") == [3, 7]


@pytest.mark.parametrize("kwargs, message", [
    (dict(tensor_model_parallel_size=3), r"world size 8 is not divisible by tensor\(3\)"),
    (dict(tensor_model_parallel_size=2, pipeline_model_parallel_size=2, context_parallel_size=4),
     r"tensor\(2\) x pipeline\(2\) x context\(4\) = 16"),
    (dict(tensor_model_parallel_size=0), "tensor_model_parallel_size=0 must be a positive integer"),
    (dict(virtual_pipeline_model_parallel_size=2), "needs pipeline_model_parallel_size > 1"),
    (dict(expert_model_parallel_size=3), r"expert\(3\)"),
])
def test_bad_sizes(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ModelParallelState(world_size=8, rank=0, **kwargs)


def test_getters_before_init_raise_clear_error():
    ps.destroy_model_parallel()
    with pytest.raises(RuntimeError, match="initialize_model_parallel"):
        ps.get_tensor_model_parallel_group()
    with pytest.raises(RuntimeError, match="not initialized"):
        ps.is_pipeline_first_stage()


def test_single_process_fallback_and_size_check():
    """Outside msrun: world size 1; asking for tp=2 fails before communication starts."""
    with pytest.raises(ValueError, match="world size 1 is not divisible"):
        ps.initialize_model_parallel(tensor_model_parallel_size=2)
    state = ps.initialize_model_parallel()
    try:
        assert ps.get_tensor_model_parallel_world_size() == 1
        assert ps.get_data_parallel_world_size() == 1
        assert ps.is_pipeline_first_stage() and ps.is_pipeline_last_stage()
        assert state.mesh.size == 1
    finally:
        ps.destroy_model_parallel()


def test_virtual_pipeline_rank():
    state = ModelParallelState(world_size=2, rank=0, pipeline_model_parallel_size=2,
                               virtual_pipeline_model_parallel_size=2)
    assert state.vpp == 2 and state.virtual_pipeline_rank == 0
