"""Worker side of the reshard tests: random layout pairs executed with real collectives."""
import numpy as np
import mindspore as ms
from mindspore import Tensor

from mindformers_core.distributed import get_env
from mindformers_core.sharding import Layout, execute_plan, plan_redistribution, reshard, shard_tensor
from tests.test_redistribution import random_layout


def _cases(device_matrix, alias, count, seed):
    rng = np.random.default_rng(seed)
    out = []
    while len(out) < count:
        ndim = int(rng.integers(1, 4))
        shape = tuple(int(rng.choice([8, 16])) for _ in range(ndim))
        src = random_layout(rng, device_matrix, alias, ndim, allow_partial=True)
        dst = random_layout(rng, device_matrix, alias, ndim, allow_partial=len(out) % 4 == 0)
        try:
            src.check_shape(shape)
            dst.check_shape(shape)
        except ValueError:
            continue
        out.append((shape, src, dst, rng.standard_normal(shape).astype(np.float32)))
    return out


def run(device_matrix, alias, count, jit_count, seed=0):
    rank = get_env().rank
    results = []
    for i, (shape, src, dst, value) in enumerate(_cases(tuple(device_matrix), tuple(alias), count, seed)):
        dt = shard_tensor(Tensor(value), layout=src)
        moved = reshard(dt, dst)
        full = moved.full_tensor().asnumpy()
        local = moved.to_local().asnumpy()
        expected_local = value[dst.local_slice(shape, rank)]
        entry = {"src": src.describe(), "dst": dst.describe(), "shape": shape,
                 "full_err": float(np.abs(full - value).max()),
                 "steps": [s.kind for s in plan_redistribution(src, dst, shape).steps]}
        if not dst.partial:
            entry["local_err"] = float(np.abs(local - expected_local).max())
        if i < jit_count:
            plan = plan_redistribution(src, dst, shape)

            @ms.jit
            def run_plan(x):
                return execute_plan(plan, x)

            out = run_plan(dt.to_local()).asnumpy()
            entry["jit_err"] = float(np.abs(out - local).max())
        results.append(entry)
    # pipeline-stage hand-off: stage ranks [0, 1] -> [2, 3] (first two axes' worth of ranks)
    if len(device_matrix) == 2 and device_matrix[0] * device_matrix[1] == 4:
        value = np.arange(32, dtype=np.float32).reshape(8, 4)
        stage0 = Layout((2,), ("tp",), rank_list=[0, 1])
        stage1 = Layout((2,), ("tp",), rank_list=[2, 3])
        if rank in (0, 1):
            dt = shard_tensor(Tensor(value), layout=stage0("tp", "None"))
            assert reshard(dt, stage1("None", "tp")) is None
            results.append({"p2p": "sent"})
        else:
            # the receiving stage names the source layout without holding its data
            src = stage0("tp", "None")
            plan = plan_redistribution(src, stage1("None", "tp"), (8, 4))
            got = execute_plan(plan, Tensor(np.zeros((1,), np.float32))).asnumpy()
            results.append({"p2p": "received", "err": float(np.abs(
                got - value[stage1("None", "tp").local_slice((8, 4), rank)]).max()),
                "steps": [s.kind for s in plan.steps]})
    return results
