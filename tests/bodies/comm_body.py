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
    names = OPS
    net = AllOps(group, names)
    xs_np, ws_np = _inputs(group.local_rank, group.size, dtype, seed)
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


def _parallel_state_report():
    """Getters of parallel_state after tp=2, pp=2 on 4 ranks (dp=1)."""
    from mindformers_core.distributed import parallel_state as ps
    ps.initialize_model_parallel(tensor_model_parallel_size=2, pipeline_model_parallel_size=2)
    report = {
        "tp": list(ps.get_tensor_model_parallel_group().ranks),
        "pp": list(ps.get_pipeline_model_parallel_group().ranks),
        "dp": list(ps.get_data_parallel_group().ranks),
        "mp": list(ps.get_model_parallel_group().ranks),
        "tp_rank": ps.get_tensor_model_parallel_rank(),
        "pp_rank": ps.get_pipeline_model_parallel_rank(),
        "tp_size": ps.get_tensor_model_parallel_world_size(),
        "pp_size": ps.get_pipeline_model_parallel_world_size(),
        "dp_size": ps.get_data_parallel_world_size(),
        "first": ps.is_pipeline_first_stage(),
        "last": ps.is_pipeline_last_stage(),
        "embedding": list(ps.get_embedding_group().ranks),
        "next": ps.get_pipeline_model_parallel_next_rank(),
        "prev": ps.get_pipeline_model_parallel_prev_rank(),
    }
    # the groups really communicate: sum of global ranks over tp and over pp
    x = Tensor(np.array([float(get_env().rank)], np.float32))
    report["tp_sum"] = float(comm.all_reduce(x, "sum", ps.get_tensor_model_parallel_group()).asnumpy()[0])
    report["pp_sum"] = float(comm.all_reduce(x, "sum", ps.get_pipeline_model_parallel_group()).asnumpy()[0])
    ps.destroy_model_parallel()
    return report


def _bad_input():
    """Errors raised before any communication, on a real multi-rank group."""
    errors = {}
    for name, call in (("reduce_scatter", lambda: comm.reduce_scatter(Tensor(np.ones((3, 4), np.float32)))),
                       ("all_to_all", lambda: comm.all_to_all(Tensor(np.ones((4, 3), np.float32)), 1, 0)),
                       ("all_reduce", lambda: comm.all_reduce(Tensor(np.ones((2,), np.float32)), "prod")),
                       ("broadcast", lambda: comm.broadcast(Tensor(np.ones((2,), np.float32)), 99)),
                       ("send", lambda: comm.send(Tensor(np.ones((2,), np.float32)), get_env().rank))):
        try:
            call()
            errors[name] = None
        except (ValueError, TypeError) as e:
            errors[name] = str(e)
    return errors


def run(cases, p2p_modes=("pynative", "jit"), mesh_shape=None, parallel_state=False):
    """``cases``: list of [group_name, dtype, mode, emulate]; group names: world, tp, dp."""
    env = get_env()
    groups = {"world": world_group()}
    if mesh_shape:
        mesh = DeviceMesh(tuple(mesh_shape), ("dp", "tp"))
        groups["tp"] = mesh.get_group("tp")
        groups["dp"] = mesh.get_group("dp")
    results = {"rank": env.rank, "world_size": env.world_size, "cases": {}, "p2p": {}}
    for gname, dtype, mode, emulate in cases:
        results["cases"][(gname, dtype, mode, emulate)] = _run_group(
            groups[gname], dtype, mode, emulate, seed=len(gname) * 31 + len(dtype))
    for mode in p2p_modes:
        results["p2p"][mode] = _p2p(mode)
    results["async"] = _async_and_barrier()
    results["bad_input"] = _bad_input()
    if parallel_state:
        results["parallel_state"] = _parallel_state_report()
    return results
