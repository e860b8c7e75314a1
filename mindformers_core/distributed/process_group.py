"""Communication groups: a rank list plus the MindSpore group name, created once per process.

MindSpore requires only the members of a group to create it; every member must create its
groups in the same order (as with any collective). Groups are cached by rank tuple.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Dict, Optional, Sequence, Tuple

from mindspore.communication import create_group

from .env import get_env


@dataclass(frozen=True)
class ProcessGroup:
    """A set of global ranks that communicate together, seen from one member."""
    name: str                 # MindSpore group name ("" for a one-rank group: no communication)
    ranks: Tuple[int, ...]    # global ranks in group order
    rank: int                 # the calling process's global rank

    @property
    def size(self) -> int:
        return len(self.ranks)

    @property
    def local_rank(self) -> int:
        """Index of the calling rank inside the group."""
        return self.ranks.index(self.rank)

    @property
    def is_world(self) -> bool:
        env = get_env()
        return self.ranks == tuple(range(env.world_size))

    def __repr__(self) -> str:
        return f"ProcessGroup(name={self.name!r}, ranks={list(self.ranks)})"


_GROUPS: Dict[Tuple[int, ...], ProcessGroup] = {}


def _group_name(ranks: Tuple[int, ...]) -> str:
    text = "_".join(map(str, ranks))
    if len(text) <= 48:
        return f"mfc_{text}"
    return f"mfc_{len(ranks)}_{hashlib.sha1(text.encode()).hexdigest()[:16]}"


def new_group(ranks: Sequence[int], tag: str = "") -> ProcessGroup:
    """The group of ``ranks`` (global ranks, in group order); the caller must be a member.
    A non-empty ``tag`` gives a separate communicator over the same ranks (its collectives are
    ordered independently of the untagged group's: e.g. the context-parallel ring's hops)."""
    env = get_env()
    key = tuple(int(r) for r in ranks)
    if tag:
        return _tagged_group(key, tag)
    if not key:
        raise ValueError("new_group: ranks must not be empty")
    if len(set(key)) != len(key):
        raise ValueError(f"new_group: ranks={list(key)} contains duplicates")
    bad = [r for r in key if not 0 <= r < env.world_size]
    if bad:
        raise ValueError(f"new_group: ranks {bad} are outside the world [0, {env.world_size})")
    if env.rank not in key:
        raise ValueError(f"new_group: rank {env.rank} is not a member of ranks={list(key)}; "
                         "MindSpore groups are created by their members only")
    cached = _GROUPS.get(key)
    if cached is not None:
        return cached
    if len(key) == 1:
        group = ProcessGroup("", key, env.rank)
    elif key == tuple(range(env.world_size)):
        group = ProcessGroup(env.world_group, key, env.rank)
    else:
        name = _group_name(key)
        create_group(name, list(key))
        group = ProcessGroup(name, key, env.rank)
    _GROUPS[key] = group
    return group


def _tagged_group(key: Tuple[int, ...], tag: str) -> ProcessGroup:
    env = get_env()
    if env.rank not in key or len(set(key)) != len(key):
        raise ValueError(f"new_group: rank {env.rank} must be a member of ranks={list(key)} (no duplicates)")
    cache_key = key + (tag,)
    cached = _GROUPS.get(cache_key)
    if cached is None:
        if len(key) == 1:
            cached = ProcessGroup("", key, env.rank)
        else:
            name = f"{_group_name(key)}_{tag}"
            create_group(name, list(key))
            cached = ProcessGroup(name, key, env.rank)
        _GROUPS[cache_key] = cached
    return cached


def world_group() -> ProcessGroup:
    env = get_env()
    return new_group(range(env.world_size))


def resolve_group(group: Optional[object]) -> ProcessGroup:
    """Accept a ProcessGroup, a rank list, or None (the world)."""
    if group is None:
        return world_group()
    if isinstance(group, ProcessGroup):
        return group
    if isinstance(group, (list, tuple, range)):
        return new_group(group)
    raise TypeError(f"group={group!r} must be a ProcessGroup, a list of ranks or None")


def clear_group_cache() -> None:
    _GROUPS.clear()
