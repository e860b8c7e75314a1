"""Distributed runtime: msrun environment, rank groups, device mesh, model-parallel state."""
from . import comm, parallel_state
from .device_mesh import DeviceMesh, get_mesh, set_mesh
from .env import (DistributedEnv, get_env, get_rank, get_world_size, init_distributed, is_initialized,
                  launched_by_msrun)
from .parallel_state import destroy_model_parallel, initialize_model_parallel
from .process_group import ProcessGroup, new_group, world_group
from .rank_generator import RankGenerator, generate_masked_orthogonal_rank_groups
from .teardown import destroy_distributed

__all__ = ["DeviceMesh", "DistributedEnv", "ProcessGroup", "RankGenerator", "comm",
           "destroy_distributed", "destroy_model_parallel", "generate_masked_orthogonal_rank_groups",
           "get_env", "get_mesh", "get_rank", "get_world_size", "init_distributed",
           "initialize_model_parallel", "is_initialized", "launched_by_msrun", "new_group",
           "parallel_state", "set_mesh", "world_group"]
