"""Worker body of bench/collective_wait.py: plain MindSpore ops only (the worker harness just initialises
communication)."""
import resource
import time

import numpy as np


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def run(late: float = 3.0, rounds: int = 3, jit: bool = False):
    """Per round: rank 1 arrives ``late`` seconds after rank 0 at an ``ops.AllReduce`` (rank 0 waits in it; eager,
    or inside an ``ms.jit`` function with ``jit``), then both ranks sleep ``late`` seconds (the control: the same
    wait without a collective)."""
    import mindspore as ms
    from mindspore import Tensor, ops
    from mindspore.communication import get_rank
    rank = get_rank()
    all_reduce = ops.AllReduce()
    if jit:
        op = all_reduce

        def reduced(t):
            return op(t)
        all_reduce = ms.jit(reduced)
    x = Tensor(np.ones(4, np.float32))
    all_reduce(x).asnumpy()                    # warm-up: kernels built, both ranks here
    rows = []
    for _ in range(rounds):
        if rank == 1:
            time.sleep(late)
        c0, m0, t0 = _cpu(), time.thread_time(), time.perf_counter()
        all_reduce(x).asnumpy()
        c1, m1, t1 = _cpu(), time.thread_time(), time.perf_counter()
        time.sleep(late)
        c2, t2 = _cpu(), time.perf_counter()
        rows.append({"collective_wall": t1 - t0, "collective_cpu": c1 - c0, "collective_main_thread_cpu": m1 - m0,
                     "sleep_wall": t2 - t1, "sleep_cpu": c2 - c1})
        all_reduce(x).asnumpy()                # both ranks in step for the next round
    return {"rank": rank, "mindspore": ms.__version__, "rows": rows}
