"""Megatron/MindFormers-style model-parallel state: sizes, rank groups and the usual getters.

``initialize_model_parallel`` lays ranks out with :class:`RankGenerator`, builds the matching
:class:`DeviceMesh` (set as the default mesh) and creates this rank's groups in one fixed order
on every rank. The state lives in one :class:`ModelParallelState` object; the module-level
getters read it and raise a clear error before initialization.
"""
from __future__ import annotations

import os
from typing import Dict, List, Optional

from .device_mesh import DeviceMesh, set_mesh
from .env import get_env, is_initialized, launched_by_msrun
from .process_group import ProcessGroup, new_group
from .rank_generator import RankGenerator

DEFAULT_ORDER = "tp-cp-ep-dp-pp"


def _positive_int(name: str, value) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"initialize_model_parallel: {name}={value!r} must be a positive integer")
    return value


def _world_size_without_init() -> int:
    """World size known before communication starts (msrun exports it), to validate early."""
    if is_initialized():
        return get_env().world_size
    return int(os.environ["MS_WORKER_NUM"]) if launched_by_msrun() else 1


class ModelParallelState:
    """Rank layout for one job: generators, mesh, and (after ``create_groups``) this rank's groups."""

    def __init__(self, world_size: int, rank: int, tensor_model_parallel_size: int = 1,
                 pipeline_model_parallel_size: int = 1,
                 virtual_pipeline_model_parallel_size: Optional[int] = None,
                 context_parallel_size: int = 1, expert_model_parallel_size: int = 1,
                 order: str = DEFAULT_ORDER) -> None:
        tp = _positive_int("tensor_model_parallel_size", tensor_model_parallel_size)
        pp = _positive_int("pipeline_model_parallel_size", pipeline_model_parallel_size)
        cp = _positive_int("context_parallel_size", context_parallel_size)
        ep = _positive_int("expert_model_parallel_size", expert_model_parallel_size)
        if virtual_pipeline_model_parallel_size is not None:
            _positive_int("virtual_pipeline_model_parallel_size", virtual_pipeline_model_parallel_size)
            if pp < 2 and virtual_pipeline_model_parallel_size > 1:
                raise ValueError("initialize_model_parallel: virtual_pipeline_model_parallel_size="
                                 f"{virtual_pipeline_model_parallel_size} needs "
                                 f"pipeline_model_parallel_size > 1 (got {pp})")
        model = tp * pp * cp
        if world_size % model:
            raise ValueError(f"initialize_model_parallel: world size {world_size} is not divisible by "
                             f"tensor({tp}) x pipeline({pp}) x context({cp}) = {model}")
        dp = world_size // model
        if world_size % (tp * ep * pp):
            raise ValueError(f"initialize_model_parallel: world size {world_size} is not divisible by "
                             f"tensor({tp}) x expert({ep}) x pipeline({pp}) = {tp * ep * pp}")
        self.world_size, self.rank = world_size, rank
        self.tp, self.pp, self.cp, self.ep, self.dp = tp, pp, cp, ep, dp
        self.vpp = virtual_pipeline_model_parallel_size
        self.virtual_pipeline_rank: Optional[int] = 0 if self.vpp else None
        self.decoder = RankGenerator(tp=tp, ep=1, dp=dp, pp=pp, cp=cp, order=order)
        self.expert = RankGenerator(tp=tp, ep=ep, dp=world_size // (tp * ep * pp), pp=pp, cp=1,
                                    order=order)
        names = list(reversed(self.decoder.ordered_names))
        sizes = list(reversed(self.decoder.ordered_size))
        self.mesh = DeviceMesh(sizes, names, rank=rank)
        self.groups: Dict[str, ProcessGroup] = {}

    # ---- pure queries --------------------------------------------------------------------
    def ranks(self, token: str, generator: str = "decoder") -> List[int]:
        """This rank's group along ``token`` (e.g. ``"dp-cp"``) as a list of global ranks."""
        gen = self.decoder if generator == "decoder" else self.expert
        for g in gen.get_ranks(token):
            if self.rank in g:
                return g
        raise AssertionError(f"rank {self.rank} not found in any {token} group")

    def embedding_ranks(self) -> List[int]:
        pp_ranks = self.ranks("pp")
        return [pp_ranks[0], pp_ranks[-1]] if len(pp_ranks) > 1 else pp_ranks

    GROUP_TOKENS = (("tp", "tp", "decoder"), ("pp", "pp", "decoder"), ("dp", "dp", "decoder"),
                    ("cp", "cp", "decoder"), ("dp_cp", "dp-cp", "decoder"),
                    ("mp", "tp-pp", "decoder"), ("tp_cp", "tp-cp", "decoder"),
                    ("ep", "ep", "expert"), ("expert_dp", "dp", "expert"))

    def create_groups(self) -> None:
        """Create this rank's groups, in the same order on every rank."""
        for key, token, gen in self.GROUP_TOKENS:
            self.groups[key] = new_group(self.ranks(token, gen))
        emb = self.embedding_ranks()
        if self.rank in emb:
            self.groups["embedding"] = new_group(emb)


_STATE: Optional[ModelParallelState] = None


def initialize_model_parallel(tensor_model_parallel_size: int = 1,
                              pipeline_model_parallel_size: int = 1,
                              virtual_pipeline_model_parallel_size: Optional[int] = None,
                              context_parallel_size: int = 1,
                              expert_model_parallel_size: int = 1,
                              order: str = DEFAULT_ORDER) -> ModelParallelState:
    """Validate sizes against the world, then set the default mesh and create this rank's groups."""
    global _STATE
    world = _world_size_without_init()
    rank = int(os.environ.get("RANK_ID", "0")) if not is_initialized() else get_env().rank
    state = ModelParallelState(world, rank, tensor_model_parallel_size, pipeline_model_parallel_size,
                               virtual_pipeline_model_parallel_size, context_parallel_size,
                               expert_model_parallel_size, order)
    env = get_env()  # starts communication only now that the layout is known to be valid
    if env.rank != state.rank:
        raise RuntimeError(f"initialize_model_parallel: RANK_ID={state.rank} but MindSpore reports "
                           f"rank {env.rank}")
    state.create_groups()
    set_mesh(state.mesh)
    _STATE = state
    return state


def model_parallel_is_initialized() -> bool:
    return _STATE is not None


def destroy_model_parallel() -> None:
    global _STATE
    _STATE = None
    set_mesh(None)


def get_parallel_state() -> ModelParallelState:
    if _STATE is None:
        raise RuntimeError("model parallel state is not initialized: call "
                           "mindformers_core.distributed.initialize_model_parallel(...) first")
    return _STATE


def _group(key: str) -> ProcessGroup:
    return get_parallel_state().groups[key]


def get_tensor_model_parallel_group() -> ProcessGroup:
    return _group("tp")


def get_pipeline_model_parallel_group() -> ProcessGroup:
    return _group("pp")


def get_data_parallel_group(with_context_parallel: bool = False) -> ProcessGroup:
    return _group("dp_cp" if with_context_parallel else "dp")


def get_context_parallel_group() -> ProcessGroup:
    return _group("cp")


def get_model_parallel_group() -> ProcessGroup:
    """Tensor x pipeline group (Megatron's "model parallel" group)."""
    return _group("mp")


def get_tensor_and_context_parallel_group() -> ProcessGroup:
    return _group("tp_cp")


def get_expert_model_parallel_group() -> ProcessGroup:
    return _group("ep")


def get_expert_data_parallel_group() -> ProcessGroup:
    return _group("expert_dp")


def get_embedding_group() -> Optional[ProcessGroup]:
    """First and last pipeline stages of this rank's pipeline; None on other stages."""
    return get_parallel_state().groups.get("embedding")


def _size(key: str) -> int:
    return _group(key).size


def _rank(key: str) -> int:
    return _group(key).local_rank


def get_tensor_model_parallel_world_size() -> int:
    return _size("tp")


def get_tensor_model_parallel_rank() -> int:
    return _rank("tp")


def get_pipeline_model_parallel_world_size() -> int:
    return _size("pp")


def get_pipeline_model_parallel_rank() -> int:
    return _rank("pp")


def get_data_parallel_world_size(with_context_parallel: bool = False) -> int:
    return _size("dp_cp" if with_context_parallel else "dp")


def get_data_parallel_rank(with_context_parallel: bool = False) -> int:
    return _rank("dp_cp" if with_context_parallel else "dp")


def get_context_parallel_world_size() -> int:
    return _size("cp")


def get_context_parallel_rank() -> int:
    return _rank("cp")


def get_expert_model_parallel_world_size() -> int:
    return _size("ep")


def get_expert_model_parallel_rank() -> int:
    return _rank("ep")


def get_virtual_pipeline_model_parallel_world_size() -> Optional[int]:
    return get_parallel_state().vpp


def get_virtual_pipeline_model_parallel_rank() -> Optional[int]:
    return get_parallel_state().virtual_pipeline_rank


def set_virtual_pipeline_model_parallel_rank(rank: int) -> None:
    state = get_parallel_state()
    if state.vpp is None or not 0 <= rank < state.vpp:
        raise ValueError(f"set_virtual_pipeline_model_parallel_rank: rank={rank} must be in "
                         f"[0, {state.vpp}) (virtual_pipeline_model_parallel_size={state.vpp})")
    state.virtual_pipeline_rank = rank


def is_pipeline_first_stage(ignore_virtual: bool = False, vp_stage: Optional[int] = None) -> bool:
    state = get_parallel_state()
    if not ignore_virtual and state.vpp:
        vp = state.virtual_pipeline_rank if vp_stage is None else vp_stage
        if vp != 0:
            return False
    return get_pipeline_model_parallel_rank() == 0


def is_pipeline_last_stage(ignore_virtual: bool = False, vp_stage: Optional[int] = None) -> bool:
    state = get_parallel_state()
    if not ignore_virtual and state.vpp:
        vp = state.virtual_pipeline_rank if vp_stage is None else vp_stage
        if vp != state.vpp - 1:
            return False
    return get_pipeline_model_parallel_rank() == get_pipeline_model_parallel_world_size() - 1


def get_pipeline_model_parallel_next_rank() -> int:
    g = get_pipeline_model_parallel_group()
    return g.ranks[(g.local_rank + 1) % g.size]


def get_pipeline_model_parallel_prev_rank() -> int:
    g = get_pipeline_model_parallel_group()
    return g.ranks[(g.local_rank - 1) % g.size]
