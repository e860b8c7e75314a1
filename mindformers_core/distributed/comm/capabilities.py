"""Which collectives run natively on this device, and which are emulated on AllReduce-SUM.

MindSpore 2.10's CPU backend (MCCL) has AllReduce with SUM on any group (float32/float16),
AllGather and Broadcast on the world group only, and nothing else. Everything missing is built
on AllReduce-SUM (see ``kernels.py``). Ascend (HCCL) and GPU (NCCL) use the native operators.
``force_emulation`` (or ``MFC_COMM_EMULATE=1``) selects the emulated path everywhere, so both
paths can be tested against each other where both exist.
"""
from __future__ import annotations

import contextlib
import os
from typing import Iterator

from ..env import get_env
from ..process_group import ProcessGroup

_FORCE = {"on": os.environ.get("MFC_COMM_EMULATE", "0") == "1"}

# op -> predicate(group) telling whether CPU has a native kernel for it
_CPU_NATIVE = {
    "all_reduce_sum": lambda g: True,
    "all_gather": lambda g: g.is_world,
    "broadcast": lambda g: g.is_world,
}
# ops MindSpore 2.10 has natively on Ascend only (``ops.AlltoAllV``: "Supported Platforms: Ascend")
_ASCEND_ONLY = {"all_to_all_v"}


def emulation_forced() -> bool:
    return _FORCE["on"]


@contextlib.contextmanager
def force_emulation(on: bool = True) -> Iterator[None]:
    """Use the AllReduce-SUM emulations even where a native kernel exists (for tests, benches)."""
    old = _FORCE["on"]
    _FORCE["on"] = on
    try:
        yield
    finally:
        _FORCE["on"] = old


def is_native(op: str, group: ProcessGroup) -> bool:
    """True when ``op`` on ``group`` maps to one MindSpore collective on this device."""
    if _FORCE["on"]:
        return False
    target = get_env().device_target
    if target in ("Ascend", "GPU"):
        return target == "Ascend" or op not in _ASCEND_ONLY
    predicate = _CPU_NATIVE.get(op)
    return bool(predicate and predicate(group))
