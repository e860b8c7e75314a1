"""Pure logic of hsdp: argument validation, rank groups, and which parameters are sharded how.

Nothing here needs MindSpore collectives, so it is unit-testable in one process.

Groups. The data-parallel ranks ``R`` (``D`` of them, in group order) are cut into ``D / S``
*shard groups* of ``S = shard_size`` consecutive ranks (``R[0:S], R[S:2S], ...``): the ranks of
a shard group share one copy of the sharded state, each holding ``1/S`` of it. Rank ``i`` of
every shard group forms a *replica group* ``R[i::S]``: those ranks hold the same shard, and their
gradients are summed by an all-reduce. ``S = 1`` is pure data parallel, ``S = D`` full ZeRO.

Parameters. A parameter (its local array: a tensor-parallel shard if it is one) is sharded when
``S > 1``, its size is at least ``threshold`` KB and one of its dims is divisible by ``S`` (the
first such dim is split; dim 0 when possible). Otherwise it stays replicated over the shard
group and behaves as in plain data parallel.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

LEVELS = ("level1", "level2", "level3")
ZERO_STAGE = {"level1": 1, "level2": 2, "level3": 3}


def _divisors(n: int) -> List[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def check_hsdp_arguments(shard_size, threshold, optimizer_level, accumulate_grad_step, dp_size: int) -> int:
    """Check hsdp's arguments; return the effective shard size (``-1`` means ``dp_size``).

    Raises ValueError naming the argument, the value and the valid values.
    """
    if optimizer_level not in LEVELS:
        raise ValueError(f"hsdp: optimizer_level={optimizer_level!r} is not valid; valid values are "
                         f"{', '.join(repr(v) for v in LEVELS)} (ZeRO-1/2/3)")
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or threshold < 0:
        raise ValueError(f"hsdp: threshold={threshold!r} must be a number of KB >= 0 "
                         "(parameters smaller than it stay unsharded)")
    if isinstance(accumulate_grad_step, bool) or not isinstance(accumulate_grad_step, int) \
            or accumulate_grad_step < 1:
        raise ValueError(f"hsdp: accumulate_grad_step={accumulate_grad_step!r} must be an integer >= 1")
    valid = _divisors(dp_size)
    if isinstance(shard_size, bool) or not isinstance(shard_size, int) or \
            (shard_size != -1 and shard_size not in valid):
        raise ValueError(f"hsdp: shard_size={shard_size!r} must divide the data-parallel size {dp_size}; "
                         f"valid values are -1 (all {dp_size} data-parallel ranks) or one of {valid}")
    return dp_size if shard_size == -1 else shard_size


def shard_rank_lists(dp_ranks: Sequence[int], shard_size: int, rank: int) -> Tuple[List[int], List[int]]:
    """(this rank's shard group, this rank's replica group), as global rank lists."""
    dp_ranks = list(dp_ranks)
    if rank not in dp_ranks:
        raise ValueError(f"hsdp: rank {rank} is not in the data-parallel group {dp_ranks}")
    if len(dp_ranks) % shard_size:
        raise ValueError(f"hsdp: shard_size={shard_size} does not divide the data-parallel size "
                         f"{len(dp_ranks)}")
    i = dp_ranks.index(rank)
    start = (i // shard_size) * shard_size
    return dp_ranks[start:start + shard_size], dp_ranks[i % shard_size::shard_size]



def check_stage_dp_ranks(dp_ranks: Sequence[int], pp_ranks: Sequence[int], rank: int) -> List[int]:
    """A pipeline stage's data-parallel group: the ranks holding the same stage (and tensor-parallel
    position) as ``rank``. So ``rank`` is in it, and it holds no other rank of ``rank``'s pipeline
    ``pp_ranks`` (those run other stages). Returns the ranks; raises ValueError otherwise."""
    dp_ranks, pp_ranks = [int(r) for r in dp_ranks], [int(r) for r in pp_ranks]
    if rank not in dp_ranks:
        raise ValueError(f"hsdp: rank {rank} is not in the stage's data-parallel group {dp_ranks}")
    others = sorted(set(dp_ranks) & set(pp_ranks) - {rank})
    if others:
        raise ValueError(f"hsdp: dp_group={dp_ranks} holds ranks {others} of this rank's pipeline "
                         f"(pp_ranks={pp_ranks}), which run other stages; a stage's data-parallel group "
                         "is the ranks holding the same stage and tensor-parallel position")
    return dp_ranks

def domain_shard_size(shard_size: int, dp_size: int, domain_size: int, what: str = "expert") -> int:
    """The shard size of parameters replicated over only ``domain_size`` of the ``dp_size``
    data-parallel ranks (expert parameters: their expert-data-parallel group, ``dp / ep`` ranks).

    The dp shard groups are ``shard_size`` consecutive dp ranks; with ``r = dp_size / domain_size``
    (the expert-parallel size) a domain group takes every ``r``-th dp rank. Its shard groups stay
    inside the dp shard groups: ``shard_size / r`` domain ranks when ``r`` divides ``shard_size``
    (full ZeRO over dp is full ZeRO over the domain), 1 (not sharded) when ``shard_size`` divides
    ``r``. Otherwise a dp shard group would hold a fraction of an expert copy: ValueError."""
    if domain_size < 1 or dp_size % domain_size:
        raise ValueError(f"hsdp: the {what} data-parallel group has {domain_size} ranks, which does not divide "
                         f"the data-parallel size {dp_size}")
    r = dp_size // domain_size
    if shard_size % r == 0:
        return shard_size // r
    if r % shard_size == 0:
        return 1
    raise ValueError(f"hsdp: shard_size={shard_size} with {what} parallel size {r} (the {what} parameters are "
                     f"replicated over {domain_size} of the {dp_size} data-parallel ranks): one of them must divide "
                     f"the other; valid shard sizes are -1, the divisors of {r} and the multiples of {r} dividing "
                     f"{dp_size}")


def lcm(a: int, b: int) -> int:
    from math import gcd
    return a * b // gcd(a, b)


@dataclass(frozen=True)
class ParamPlan:
    """How one parameter is held. ``shape`` is the local (pre-hsdp) shape."""
    name: str
    shape: Tuple[int, ...]
    itemsize: int
    sharded: bool
    dim: Optional[int]           # the split dim when sharded
    shard_shape: Tuple[int, ...]  # == shape when not sharded
    offset: int                  # start of this rank's slice along ``dim`` (0 when not sharded)
    reason: str

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def nbytes(self) -> int:
        return self.numel * self.itemsize

    @property
    def shard_nbytes(self) -> int:
        n = self.itemsize
        for d in self.shard_shape:
            n *= d
        return n


def plan_param(name: str, shape: Sequence[int], itemsize: int, shard_size: int, threshold_kb: float,
               shard_index: int) -> ParamPlan:
    """Decide how to hold one parameter (``shard_index`` = this rank's index in its shard group)."""
    shape = tuple(int(d) for d in shape)
    nbytes = itemsize
    for d in shape:
        nbytes *= d

    def keep(reason):
        return ParamPlan(name, shape, itemsize, False, None, shape, 0, reason)

    if shard_size == 1:
        return keep("shard_size=1 (pure data parallel)")
    if nbytes < threshold_kb * 1024:
        return keep(f"{nbytes / 1024:.2f} KB < threshold {threshold_kb} KB")
    for dim, size in enumerate(shape):
        if size % shard_size == 0:
            part = size // shard_size
            shard_shape = shape[:dim] + (part,) + shape[dim + 1:]
            return ParamPlan(name, shape, itemsize, True, dim, shard_shape, shard_index * part,
                             f"dim {dim} split {shard_size} ways")
    return keep(f"no dim of {shape} is divisible by shard_size={shard_size}")


def plan_table(plans: Sequence[ParamPlan], level: str, shard_size: int) -> str:
    """A table of the plan: one row per parameter."""
    rows = [f"hsdp {level} (ZeRO-{ZERO_STAGE[level]}), shard_size={shard_size}",
            f"{'parameter':40s} {'shape':>16s} {'KB':>9s} {'held shape':>16s}  note"]
    for p in plans:
        held = p.shard_shape if (p.sharded and level == "level3") else p.shape
        rows.append(f"{p.name:40s} {str(p.shape):>16s} {p.nbytes / 1024:9.2f} {str(held):>16s}  {p.reason}")
    sharded = sum(p.nbytes for p in plans if p.sharded)
    total = sum(p.nbytes for p in plans)
    rows.append(f"sharded {sharded / 1024:.1f} KB of {total / 1024:.1f} KB")
    return "\n".join(rows)


def zero_bytes(plans: Sequence[ParamPlan], level: str, shard_size: int, state_factor: int = 2,
               ignore_threshold: bool = False) -> dict:
    """Per-rank bytes of parameters, gradients and optimizer states by the ZeRO formulas.

    With ``P`` bytes of parameters, ``S`` the shard size and ``k`` optimizer states per element
    (AdamW: 2 of the parameter's dtype): data parallel holds ``P``, ``P``, ``kP``; ZeRO-1
    ``P``, ``P``, ``kP/S``; ZeRO-2 ``P``, ``P/S``, ``kP/S``; ZeRO-3 ``P/S``, ``P/S``, ``kP/S``.
    Parameters hsdp keeps unsharded count in full (``ignore_threshold`` applies the formula to
    every parameter, as the ZeRO paper does).
    """
    stage = ZERO_STAGE[level]
    sharded = sum(p.nbytes for p in plans if p.sharded or ignore_threshold)
    rest = sum(p.nbytes for p in plans) - sharded
    s = shard_size
    return {
        "params": rest + (sharded / s if stage >= 3 else sharded),
        "grads": rest + (sharded / s if stage >= 2 else sharded),
        "optimizer": state_factor * (rest + sharded / s),
    }
