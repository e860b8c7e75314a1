"""Process-level runtime: is this an msrun worker, and MindSpore communication init/teardown.

``init_distributed`` reads what ``msrun`` exports (``MS_ROLE``, ``MS_WORKER_NUM``,
``RANK_ID``...). Outside msrun it sets up a one-process world with no communication, so the
same script runs unchanged on one process or many.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

import mindspore as ms
from mindspore import communication as ms_comm

_BACKENDS = {"Ascend": "hccl", "GPU": "nccl", "CPU": "mccl"}


@dataclass(frozen=True)
class DistributedEnv:
    """What ``init_distributed`` found: world size, this process's rank, device and backend."""
    rank: int
    world_size: int
    local_rank: int
    device_target: str
    backend: Optional[str]          # None for a single process without communication
    world_group: Optional[str]      # MindSpore's world group name, None when single process

    @property
    def is_distributed(self) -> bool:
        return self.backend is not None


_ENV: Optional[DistributedEnv] = None


def launched_by_msrun() -> bool:
    """True inside a process spawned by msrun: a worker, or the scheduler (which runs the same
    script and serves the cluster from inside ``mindspore.communication.init``)."""
    return os.environ.get("MS_ROLE") in ("MS_WORKER", "MS_SCHED") and "MS_WORKER_NUM" in os.environ


def requested_device_target(configured: Optional[str] = None) -> str:
    """The device a job asks for, before anything is initialised: ``MFC_DEVICE_TARGET`` (environment),
    else ``configured`` (e.g. a YAML's ``context.device_target``), else MindSpore's context. The one
    place this order is written: the trainer's preflight and CPU-thread setting read it too."""
    return os.environ.get("MFC_DEVICE_TARGET") or configured or ms.get_context("device_target")


def _device_target(device_target: Optional[str]) -> str:
    if device_target is None:
        device_target = requested_device_target()
    if device_target not in _BACKENDS:
        raise ValueError(f"init_distributed: device_target={device_target!r} is not supported; "
                         f"valid values are {sorted(_BACKENDS)}")
    return device_target


def init_distributed(device_target: Optional[str] = None) -> DistributedEnv:
    """Initialize communication once and return the process's :class:`DistributedEnv`.

    Backend follows the device: HCCL on Ascend, NCCL on GPU, MCCL on CPU. Calling it again
    returns the same environment (a different ``device_target`` is an error).
    """
    global _ENV
    if _ENV is not None:
        if device_target is not None and device_target != _ENV.device_target:
            raise RuntimeError(f"init_distributed: already initialized for device_target="
                               f"{_ENV.device_target!r}, cannot switch to {device_target!r}")
        return _ENV
    target = _device_target(device_target)
    if ms.get_context("device_target") != target:
        ms.set_device(target)
    if not launched_by_msrun():
        _ENV = DistributedEnv(rank=0, world_size=1, local_rank=0, device_target=target,
                              backend=None, world_group=None)
        return _ENV
    backend = _BACKENDS[target]
    ms_comm.init(backend)
    rank, world = ms_comm.get_rank(), ms_comm.get_group_size()
    expected = int(os.environ["MS_WORKER_NUM"])
    if world != expected:
        raise RuntimeError(f"init_distributed: MindSpore reports world size {world} but msrun "
                           f"set MS_WORKER_NUM={expected}")
    _ENV = DistributedEnv(rank=rank, world_size=world, local_rank=ms_comm.get_local_rank(),
                          device_target=target, backend=backend,
                          world_group=ms_comm.GlobalComm.WORLD_COMM_GROUP)
    return _ENV


def get_env() -> DistributedEnv:
    """The environment set by :func:`init_distributed` (initializing a single process if needed)."""
    return _ENV if _ENV is not None else init_distributed()


def is_initialized() -> bool:
    return _ENV is not None


def get_rank() -> int:
    return get_env().rank


def get_world_size() -> int:
    return get_env().world_size


def release_distributed() -> bool:
    """Release MindSpore communication and forget the environment; False when not initialized. The
    caches above it (groups, collective Cells) are cleared first by ``teardown.destroy_distributed``."""
    global _ENV
    if _ENV is None:
        return False
    if _ENV.is_distributed:
        ms_comm.release()
    _ENV = None
    return True
