"""Worker side of the collective tests: every collective and autograd pair on every group, in
PyNative and ms.jit, natively and emulated; returns inputs, outputs and gradients for the
parent test to check against NumPy."""
import numpy as np
import mindspore as ms
from mindspore import Tensor, nn

from mindformers_core.distributed import DeviceMesh, get_env, world_group
from mindformers_core.distributed import comm

SHAPE = (4, 8)
# every op gets its own input so gradients stay separate; order matches AllOps.construct
OPS = ("all_reduce_sum", "all_reduce_avg", "all_reduce_max", "all_reduce_min", "all_gather_0",
       "all_gather_1", "reduce_scatter_0", "reduce_scatter_1", "all_to_all_1_0", "all_to_all_0_1",
       "broadcast", "copy_to_region", "reduce_from_region", "scatter_to_region",
       "gather_from_region", "scatter_to_sp", "gather_from_sp", "reduce_scatter_to_sp")


def apply_op(name, x, g):
    """One collective by name (names are compile-time constants under ms.jit)."""
    if name == "all_reduce_sum":
        return comm.all_reduce(x, "sum", g)
    if name == "all_reduce_avg":
        return comm.all_reduce(x, "avg", g)
    if name == "all_reduce_max":
        return comm.all_reduce(x, "max", g)
    if name == "all_reduce_min":
        return comm.all_reduce(x, "min", g)
    if name == "all_gather_0":
        return comm.all_gather(x, 0, g)
    if name == "all_gather_1":
        return comm.all_gather(x, -1, g)
    if name == "reduce_scatter_0":
        return comm.reduce_scatter(x, 0, g)
    if name == "reduce_scatter_1":
        return comm.reduce_scatter(x, 1, g)
    if name == "all_to_all_1_0":
        return comm.all_to_all(x, 1, 0, g)
    if name == "all_to_all_0_1":
        return comm.all_to_all(x, 0, 1, g)
    if name == "broadcast":
        return comm.broadcast(x, g.ranks[-1], g)
    if name == "copy_to_region":
        return comm.copy_to_region(x, g)
    if name == "reduce_from_region":
        return comm.reduce_from_region(x, g)
    if name == "scatter_to_region":
        return comm.scatter_to_region(x, g)
    if name == "gather_from_region":
        return comm.gather_from_region(x, g)
    if name == "scatter_to_sp":
        return comm.scatter_to_sequence_parallel_region(x, g)
    if name == "gather_from_sp":
        return comm.gather_from_sequence_parallel_region(x, g)
    return comm.reduce_scatter_to_sequence_parallel_region(x, g)


class AllOps(nn.Cell):
    """Applies each named op to its own input; loss = sum_k <out_k, w_k>."""

    def __init__(self, group, names):
        super().__init__()
        self.group = group
        self.names = tuple(names)

    def construct(self, *args):
        n = len(self.names)
        outs = ()
        loss = 0
        for k in range(n):
            out = apply_op(self.names[k], args[k], self.group)
            loss = loss + (out * args[n + k]).astype(ms.float32).sum()
            outs = outs + (out,)
        return loss, outs


def _inputs(rank, group_size, dtype, seed):
    """Distinct values per element across ranks (no ties for max/min), deterministic per rank."""
    rng = np.random.default_rng(seed)
    xs, ws = [], []
    for name in OPS:
        everyone = (rng.permutation(group_size * 64 * 32)[:64 * group_size]
                    .reshape(64, group_size).astype(np.float64) / 64.0)
        # rank r takes column r of a table built identically on every rank
        xs.append(everyone[:, rank % group_size].reshape(SHAPE[0], 16)[:, :SHAPE[1]].astype(dtype))
        out_shape = _out_shape(name, group_size)
        ws.append(rng.standard_normal((group_size,) + out_shape)[rank % group_size].astype(dtype))
    return xs, ws


def _out_shape(name, n):
    r, c = SHAPE
    return {"all_gather_0": (r * n, c), "all_gather_1": (r, c * n), "reduce_scatter_0": (r // n, c),
            "reduce_scatter_1": (r, c // n), "all_to_all_1_0": (r * n, c // n),
            "all_to_all_0_1": (r // n, c * n), "scatter_to_region": (r, c // n),
            "gather_from_region": (r, c * n), "scatter_to_sp": (r // n, c),
            "gather_from_sp": (r * n, c), "reduce_scatter_to_sp": (r // n, c)}.get(name, SHAPE)


def _run_group(group, dtype, mode, emulate, seed):
    import os
    names = os.environ.get("T_OPS", ",".join(OPS)).split(",")
    net = AllOps(group, names)
    xs_np, ws_np = _inputs(group.local_rank, group.size, dtype, seed)
    idx = [OPS.index(n) for n in names]
    xs_np, ws_np = [xs_np[i] for i in idx], [ws_np[i] for i in idx]
    xs = tuple(Tensor(x) for x in xs_np)
    ws = tuple(Tensor(w) for w in ws_np)
    grad_fn = ms.value_and_grad(net, grad_position=tuple(range(len(names))), has_aux=True)

    def step(*args):
        return grad_fn(*args)

    if mode == "jit":
        step = ms.jit(step)
    with comm.force_emulation(emulate):
        (loss, outs), grads = step(*xs, *ws)
    return {"inputs": xs_np, "weights": ws_np, "outputs": [o.asnumpy() for o in outs],
            "grads": [g.asnumpy() for g in grads], "ranks": list(group.ranks),
            "native": {name: comm.is_native(name, group) and not emulate
                       for name in ("all_gather", "broadcast", "reduce_scatter", "all_to_all")}}


def _p2p(mode):
    """Send from every rank to every other rank, with the gradient coming back."""
    env = get_env()
    n, me = env.world_size, env.rank
    out = {}
    for src in range(n):
        for dst in range(n):
            if src == dst or me not in (src, dst):
                continue
            x = Tensor(np.arange(6, dtype=np.float32).reshape(2, 3) + 10 * src + dst)
            w = Tensor(np.full((2, 3), 1.0 + src + 0.5 * dst, np.float32))

            if me == src:
                def f(x):
                    return comm.send(x * 2.0, dst)
            else:
                def f(x):
                    y = comm.recv(x, src)
                    return (y * w).sum(), y
            fn = ms.value_and_grad(f, grad_position=0, has_aux=(me == dst))
            if mode == "jit":
                fn = ms.jit(fn)
            value, grad = fn(x)
            if me == src:
                out[(src, dst, "send")] = {"grad": grad.asnumpy()}
            else:
                out[(src, dst, "recv")] = {"received": value[1].asnumpy(), "grad": grad.asnumpy()}
    return out


def _async_and_barrier():
    world = world_group()
    comm.barrier()
    x = Tensor(np.full((3,), float(world.rank + 1), np.float32))
    work = comm.all_reduce(x, "sum", world, async_op=True)
    total = work.wait().asnumpy()
    res = {"async_sum": total}
    if world.size > 1:
        me = world.rank
        nxt, prv = (me + 1) % world.size, (me - 1) % world.size
        # even ranks send first, odd ranks receive first: no deadlock on the blocking emulation
        if me % 2 == 0:
            comm.isend(x, nxt).wait()
            got = comm.irecv(x, prv).wait()
        else:
            got = comm.irecv(x, prv).wait()
            comm.isend(x, nxt).wait()
        res["ring_recv"] = got.asnumpy()
    comm.barrier()
    return res


def run(modes=("pynative", "jit"), dtypes=("float32", "float16"), mesh_shape=None):
    import os
    if os.environ.get("T_INTER"):
        ms.set_context(inter_op_parallel_num=1)
    if os.environ.get("T_BLOCK"):
        ms.runtime.launch_blocking()
    env = get_env()
    groups = {"world": world_group()}
    if mesh_shape:
        mesh = DeviceMesh(tuple(mesh_shape), ("dp", "tp"))
        groups["tp"] = mesh.get_group("tp")
        groups["dp"] = mesh.get_group("dp")
    results = {"rank": env.rank, "world_size": env.world_size, "cases": {}}
    for gname, group in groups.items():
        for dtype in dtypes:
            for mode in modes:
                emulations = (False, True) if gname == "world" else (False,)
                for emulate in emulations:
                    key = (gname, dtype, mode, emulate)
                    results["cases"][key] = _run_group(group, dtype, mode, emulate,
                                                       seed=hash((gname, dtype)) % 1000 + 7)
    for mode in modes:
        if os.environ.get("T_NOP2P"):
            break
        results[("p2p", mode)] = _p2p(mode)
    results["async"] = _async_and_barrier()
    return results
