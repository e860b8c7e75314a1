"""Worker side of bench/pipeline_p2p.py: ways to move one tensor from rank 0 to rank 1 on CPU
(MindSpore 2.10's MCCL has no Send/Receive) and what a host sync after each transfer costs."""
import time

import numpy as np
from mindspore import Tensor, nn, ops
from mindspore.communication import create_group

from mindformers_core.distributed import get_env
from mindformers_core.distributed import comm


class _PairAllReduce(nn.Cell):
    """Sender contributes x, receiver zeros: the sum is x on both (today's emulation)."""

    def __init__(self, group):
        super().__init__()
        self.prim = ops.AllReduce(group=group)

    def construct(self, x):
        return self.prim(x)


class _Broadcast(nn.Cell):
    def __init__(self, group, root):
        super().__init__()
        self.prim = ops.Broadcast(root_rank=root, group=group)

    def construct(self, x):
        return self.prim((x,))[0]


class _Gather(nn.Cell):
    """World all-gather, the receiver keeps the sender's slot."""

    def __init__(self, group, src):
        super().__init__()
        self.prim, self.src = ops.AllGather(group=group), src

    def construct(self, x):
        return self.prim(ops.expand_dims(x, 0))[self.src]


def run(sizes, repeats=20):
    env = get_env()
    rank, n = env.rank, env.world_size
    pair = "mfc_bench_pair01"
    if rank in (0, 1):
        create_group(pair, [0, 1])
    ways = {"pair all-reduce": _PairAllReduce(pair) if rank in (0, 1) else None,
            "world all-reduce": _PairAllReduce("hccl_world_group"),
            "world broadcast": _Broadcast("hccl_world_group", 0),
            "world all-gather": _Gather("hccl_world_group", 0)}
    if n == 2:
        ways.pop("world all-reduce")   # the pair is the world
    rows = []
    for numel in sizes:
        x = Tensor(np.ones((numel,), np.float32)) if rank == 0 else Tensor(np.zeros((numel,), np.float32))
        for name, cell in ways.items():
            involved = name.startswith("world") or rank in (0, 1)
            for sync_each in (True, False):
                if involved:
                    cell(x).asnumpy()   # warm-up (kernel build)
                comm.barrier()
                start = time.perf_counter()
                out = None
                if involved:
                    for _ in range(repeats):
                        out = cell(x)
                        if sync_each:
                            out.asnumpy()
                    if out is not None:
                        out.asnumpy()
                elapsed = (time.perf_counter() - start) / repeats
                ok = bool(np.allclose(out.asnumpy(), 1.0)) if out is not None else True
                rows.append({"way": name, "numel": numel, "bytes": numel * 4, "ranks": n, "rank": rank,
                             "sync_each": sync_each, "seconds": elapsed, "correct": ok, "involved": involved})
                comm.barrier()
    return rows
