"""Worker side of bench/comm.py: time each collective (PyNative, forward) for a few sizes."""
import time

import numpy as np
from mindspore import Tensor

from mindformers_core.distributed import get_env, world_group
from mindformers_core.distributed import comm


def _ops(n, rank):
    peer = rank ^ 1  # pairs (0,1), (2,3): every rank sends once and receives once per round
    return {
        "all_reduce_sum": lambda x: comm.all_reduce(x, "sum"),
        "all_reduce_max": lambda x: comm.all_reduce(x, "max"),
        "all_gather": lambda x: comm.all_gather(x, 0),
        "reduce_scatter": lambda x: comm.reduce_scatter(x, 0),
        "all_to_all": lambda x: comm.all_to_all(x, 0, 0),
        "broadcast": lambda x: comm.broadcast(x, 0),
        "send_recv": (lambda x: comm.send(x, peer)) if rank % 2 == 0 else (lambda x: comm.recv(x, peer)),
    }


def _path(name, group):
    """How ``name`` runs by default on this device: native, emulated, or mixed (emulated on top
    of a native all-gather: max/min and all-to-all on the CPU world group)."""
    if name == "all_reduce_sum":
        return "native"
    if name in ("all_reduce_max", "all_to_all"):
        return "mixed" if comm.is_native("all_gather", group) else "emulated"
    key = "send" if name == "send_recv" else name
    return "native" if comm.is_native(key, group) else "emulated"


def run(sizes, repeats=5):
    env = get_env()
    group = world_group()
    n = group.size
    rows = []
    for numel in sizes:
        x = Tensor(np.ones((n * 8, numel // (n * 8)), np.float32))
        for emulate in (False, True):
            with comm.force_emulation(emulate):
                for name, fn in _ops(n, env.rank).items():
                    if emulate:
                        with comm.force_emulation(False):
                            default = _path(name, group)
                        if default == "emulated" or name == "all_reduce_sum":
                            continue  # same kernel as the default pass
                    path = "emulated" if emulate else _path(name, group)
                    fn(x).asnumpy()  # warm-up: builds the cached Cell and kernels
                    comm.barrier()
                    start = time.perf_counter()
                    for _ in range(repeats):
                        fn(x).asnumpy()
                    elapsed = (time.perf_counter() - start) / repeats
                    rows.append({"op": name, "numel": numel, "bytes": numel * 4, "ranks": n,
                                 "path": path, "seconds": elapsed})
    return rows
