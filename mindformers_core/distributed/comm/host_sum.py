"""All-reduce SUM of many float32 tensors among the ranks of one host, through shared memory.

Why: MindSpore 2.10's CPU collective (MCCL) spends 58-64 ms of CPU per rank to all-reduce the
19 MB of gradients of the bench Llama between 2 processes (bench/grad_allreduce.py; PyTorch's
gloo moves the same bytes in 14 ms), and that is most of what data parallelism adds to a step
on CPU. When every rank of a group runs on this host, the same sum is a few memory copies:

1. each rank copies its tensors into its own slot of a file in /dev/shm and bumps its counter;
2. once every counter has moved, rank ``r`` sums chunk ``r`` of the flat payload over the slots
   (in rank order: every rank gets the same bits) into the result area, and bumps again;
3. once every counter has moved again, each rank copies the result out.

No locks: a rank writes only its own slot and counter; it rewrites its slot (step 1 of the next
call) only after every rank has bumped past step 2, i.e. has summed from it, and rewrites the result
area only after every rank has bumped past step 1 of the next call, i.e. has copied the result out.
Waiting sleeps in short naps (it does not spin on a core the other rank needs). The file is
unlinked once every rank has mapped it (after the first phase of the first call), so a killed job
leaves nothing in /dev/shm.

``HostSum(ranks, shapes)`` runs on the host, between compiled graphs (a ``pyfunc`` operator inside
a graph fails in MindSpore 2.10's synchronous launch: "The prim is not a PrimitivePy") or among
eager ops. Only for float32 tensors and groups whose ranks all run on this host
(``host_sum_applies``); anything else keeps the MindSpore collective.
"""
from __future__ import annotations

import atexit
import mmap
import os
import platform
import time
from typing import Sequence, Tuple

import numpy as np


_COUNTER_STRIDE = 8          # int64 counters 64 bytes apart (one cache line each)
_HEADER = 4096
_TIMEOUT_S = float(os.environ.get("MFC_HOST_SUM_TIMEOUT", "600"))
# Python has no memory fences: a rank's slot writes must become visible to the others before its counter
# bump, which x86-64's total store order guarantees and weaker memory models (aarch64) do not
_ORDERED_STORES = ("x86_64", "amd64")


def host_sum_enabled(environ=None) -> bool:
    """``MFC_HOST_SUM=0`` turns the shared-memory sum off (MindSpore's collective everywhere)."""
    return (os.environ if environ is None else environ).get("MFC_HOST_SUM", "1") != "0"


def host_sum_applies(ranks: Sequence[int], dtypes: Sequence) -> bool:
    """Whether ``HostSum`` can replace MindSpore's all-reduce over ``ranks`` for tensors of ``dtypes``:
    enabled, a CPU job launched by msrun (its scheduler port names the shared file), more than one rank,
    float32 only, every rank of the job on this host, an x86-64 host (``_ORDERED_STORES``)."""
    import mindspore as ms
    from mindspore import communication as mc
    from ..env import get_env
    if platform.machine().lower() not in _ORDERED_STORES:
        return False
    if not host_sum_enabled() or len(ranks) < 2 or not os.environ.get("MS_SCHED_PORT") or get_env().device_target != "CPU":
        return False
    if any(d != ms.float32 for d in dtypes):
        return False
    try:
        return mc.get_local_rank_size() == get_env().world_size
    except Exception:       # noqa: BLE001 -- no communication initialised: nothing to replace
        return False


class _Segment:
    """The shared file of one group and payload size: counters, one slot per rank, the result."""

    def __init__(self, ranks: Tuple[int, ...], me: int, floats: int):
        self.n, self.me, self.floats = len(ranks), me, floats
        # the job's scheduler address names the file: one live job per port on a host
        job = f"{os.environ.get('MS_SCHED_HOST', '')}_{os.environ['MS_SCHED_PORT']}"
        self.path = f"/dev/shm/mfc_host_sum_{job}_{'_'.join(map(str, ranks))}_{floats}"
        self.linked = True
        size = _HEADER + (self.n + 1) * floats * 4
        fd = os.open(self.path, os.O_CREAT | os.O_RDWR, 0o600)
        try:
            if os.fstat(fd).st_size < size:
                os.ftruncate(fd, size)       # every rank asks for the same size: order does not matter
            self.map = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        atexit.register(self.close)
        self.counters = np.frombuffer(self.map, np.int64, self.n * _COUNTER_STRIDE, 0)[::_COUNTER_STRIDE]
        self.slots = np.frombuffer(self.map, np.float32, self.n * floats, _HEADER).reshape(self.n, floats)
        self.result = np.frombuffer(self.map, np.float32, floats, _HEADER + self.n * floats * 4)
        self.generation = int(self.counters[self.me])
        bounds = np.linspace(0, floats, self.n + 1).astype(np.int64)
        self.chunk = slice(int(bounds[self.me]), int(bounds[self.me + 1]))

    def _publish_and_wait(self):
        self.generation += 1
        self.counters[self.me] = self.generation
        deadline, nap = time.monotonic() + _TIMEOUT_S, 0.0
        while int(self.counters.min()) < self.generation:
            if nap:
                time.sleep(nap)
                if time.monotonic() > deadline:
                    raise RuntimeError(f"host_sum: rank {self.me} of {self.n} waited {_TIMEOUT_S:.0f} s for the "
                                       f"others at {self.path} (counters {self.counters.tolist()}, expected "
                                       f"{self.generation}); set MFC_HOST_SUM=0 to use MindSpore's collective")
            nap = min(2e-4, nap + 2e-5)

    def sum(self, arrays: Sequence[np.ndarray], scale: float = 1.0) -> Tuple[np.ndarray, ...]:
        mine, at = self.slots[self.me], 0
        for a in arrays:
            mine[at:at + a.size] = a.reshape(-1)
            if scale != 1.0:
                mine[at:at + a.size] *= np.float32(scale)
            at += a.size
        self._publish_and_wait()
        if self.linked:     # every rank has the file mapped now: the name can go (nothing left if a rank is killed)
            self.linked = False
            if self.me == 0:
                os.unlink(self.path)
        c = self.chunk
        np.add(self.slots[0, c], self.slots[1, c], out=self.result[c])
        for r in range(2, self.n):
            np.add(self.result[c], self.slots[r, c], out=self.result[c])
        self._publish_and_wait()
        out, at = [], 0
        for a in arrays:
            out.append(self.result[at:at + a.size].reshape(a.shape).copy())
            at += a.size
        return tuple(out)

    def close(self):
        try:
            self.counters = self.slots = self.result = None
            self.map.close()
            if self.linked:
                os.unlink(self.path)
        except (OSError, BufferError, ValueError):
            pass


class HostSum:
    """``host_sum(tensors) -> tensors``: the element-wise sum over the global ``ranks`` (this rank among
    them) of each float32 Tensor (shapes fixed at construction), through shared memory (module
    docstring). Runs on the host, between compiled graphs or among eager ops; every rank of ``ranks``
    must call it, as often (like any collective)."""

    def __init__(self, ranks: Sequence[int], shapes: Sequence[Tuple[int, ...]]):
        from ..env import get_env
        self.ranks = tuple(int(r) for r in ranks)
        if get_env().rank not in self.ranks:
            raise ValueError(f"HostSum: rank {get_env().rank} is not among ranks={list(self.ranks)}")
        self.me = self.ranks.index(get_env().rank)
        self.shapes = tuple(tuple(int(d) for d in s) for s in shapes)
        self.floats = int(sum(int(np.prod(s)) for s in self.shapes))
        self.segment = None

    def __call__(self, tensors, scale: float = 1.0):
        """The sums of ``tensors``, each rank's contribution multiplied by its ``scale`` first."""
        from mindspore import Tensor
        if len(tensors) != len(self.shapes):
            raise ValueError(f"HostSum: {len(tensors)} tensors given, built for {len(self.shapes)}")
        if self.segment is None:
            self.segment = _Segment(self.ranks, self.me, self.floats)
        arrays = [t.asnumpy() for t in tensors]
        return tuple(Tensor.from_numpy(a) for a in self.segment.sum(arrays, scale))
