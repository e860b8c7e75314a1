"""Foundation demo body: rank groups, a mesh, and collectives checked on real msrun workers.

Run by ``scripts/demo.py`` on 2 processes; each rank returns what it saw.
"""
import numpy as np
import mindspore as ms
from mindspore import Tensor

from mindformers_core.distributed import DeviceMesh, RankGenerator, get_env
from mindformers_core.distributed import comm


def main():
    env = get_env()
    mesh = DeviceMesh((env.world_size,), ("tp",))
    tp = mesh.get_group("tp")
    x = Tensor(np.arange(4, dtype=np.float32) + 10 * env.rank)
    summed = comm.all_reduce(x, "sum", tp)
    gathered = comm.all_gather(x, 0, tp)

    @ms.jit
    def jit_step(x):
        # tensor-parallel pair under graph mode: identity forward, all-reduce backward
        def loss(x):
            return (comm.copy_to_region(x, tp) * comm.copy_to_region(x, tp)).sum()
        return ms.value_and_grad(loss)(x)

    loss, grad = jit_step(x)
    expected_sum = sum(np.arange(4) + 10 * r for r in range(env.world_size))
    expected_grad = sum(2 * (np.arange(4) + 10 * r) for r in range(env.world_size))
    example = RankGenerator(tp=2, ep=1, dp=3, pp=4, cp=1, order="tp-dp-pp")
    return {
        "rank": env.rank, "world_size": env.world_size, "backend": env.backend,
        "mesh": repr(mesh), "tp_group": list(tp.ranks),
        "all_reduce": summed.asnumpy().tolist(), "all_reduce_ok": bool(np.allclose(summed.asnumpy(), expected_sum)),
        "all_gather": gathered.asnumpy().tolist(),
        "jit_grad_ok": bool(np.allclose(grad.asnumpy(), expected_grad)), "jit_loss": float(loss.asnumpy()),
        "example_dp_groups": example.get_ranks("dp"), "example_pp_groups": example.get_ranks("pp"),
    }
