"""msrun worker body of bench/step_breakdown.py: the trainer's own step for one config, taken apart
on each rank, the parts timed in turn round by round (so a slow phase of the machine spreads over
all of them), each with this process's CPU seconds (user + sys, all threads, getrusage) next to
its wall seconds.

Parts (each a callable built from the trainer's own objects after ``Trainer.setup``):

* ``step``: ``trainer.step_fn`` and the host read of loss and norm, as the training loop runs it;
* ``grads``: the model's ``value_and_grad`` (compiled like the step under jit): forward and
  backward, with the collectives a tensor-parallel model does inside them;
* ``update``: the step's ``GradientUpdate`` (reduce -> clip -> guard -> AdamW) on those gradients;
  ``reduce``: its reduce alone (the data-parallel gradient all-reduce);
* one entry per collective the step issues (recorded by running grads and update once eagerly
  with the primitives wrapped), each replayed alone in a compiled graph right after a barrier:
  its transfer without waiting for the peer, times how often the step issues it;
* ``barrier``: a one-float all-reduce right after ``step``: how long this rank waits for the
  other to finish its step (skew), less ``barrier_idle`` (the same right after a barrier: its cost).

Derived (bench/step_breakdown.py): compute = grads - collectives inside grads; optimizer = update -
reduce; collectives; host/Python = step - grads - update (what the one step does beyond its
parts run alone: launch, Python, the loss read; negative when the parts alone cost more).
"""
import os
import resource
import statistics
import time


def _cpu():
    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_utime + u.ru_stime


def _timed(fn):
    c0, t0 = _cpu(), time.perf_counter()
    fn()
    return time.perf_counter() - t0, _cpu() - c0


def _closure(fn, name):
    """A free variable of a closure, by name (the step's pieces live in build_train_step's closures)."""
    fn = getattr(fn, "__wrapped__", fn)
    return fn.__closure__[fn.__code__.co_freevars.index(name)].cell_contents


class CollectiveLog:
    """Wraps MindSpore's collective primitives while the pieces run once eagerly: (kind, shape,
    dtype, group) of every call, in order."""
    KINDS = ("AllReduce", "AllGather", "ReduceScatter", "Broadcast", "AlltoAll")

    def __init__(self):
        from mindspore import ops
        self.calls, self.saved = [], {}
        for kind in self.KINDS:
            cls = getattr(ops, kind, None)
            if cls is None:
                continue
            self.saved[cls] = cls.__call__

            def call(prim, *args, _orig=cls.__call__, _kind=kind, **kw):
                x = args[0][0] if isinstance(args[0], (tuple, list)) else args[0]
                self.calls.append((_kind, tuple(x.shape), str(x.dtype), getattr(prim, "group", None),
                                   getattr(prim, "op", None) if _kind == "AllReduce" else None))
                return _orig(prim, *args, **kw)
            cls.__call__ = call

    def restore(self):
        for cls, fn in self.saved.items():
            cls.__call__ = fn


def _replay_cell(kind, shape, dtype, group, op):
    """One collective alone in a graph: the same primitive, shape and group as in the step."""
    import numpy as np
    import mindspore as ms
    from mindspore import ops
    prim = {"AllReduce": lambda: ops.AllReduce(op=op or "sum", group=group),
            "AllGather": lambda: ops.AllGather(group=group),
            "ReduceScatter": lambda: ops.ReduceScatter(op="sum", group=group),
            "Broadcast": lambda: ops.Broadcast(0, group=group),
            "AlltoAll": None}[kind]
    if prim is None:
        return None
    p = prim()
    np_dtype = {"Float32": np.float32, "Float16": np.float16, "Int32": np.int32}.get(dtype, np.float32)
    x = ms.Tensor(np.ones(shape, np_dtype))
    if kind == "Broadcast":
        def alone(t):
            return p((t,))[0]
    else:
        def alone(t):
            return p(t)
    graph = ms.jit(alone)

    def replay():
        return graph(x).asnumpy()
    return replay


def run(argv, rounds=6, warmup=2):
    import mindspore as ms
    from mindspore import Tensor
    from mindformers_core.common.batch import model_args
    from mindformers_core.common.graphs import compile_blocking
    from mindformers_core.training.arguments import parse, resolve_config_path
    from mindformers_core.training.cli import _dialect_overrides, cpu_threads, pynative_sync
    from mindformers_core.training.config import read_yaml, validate
    from mindformers_core.training.trainer import Trainer
    worker_num = int(os.environ.get("MS_WORKER_NUM", "1"))
    args, overrides = parse(list(argv))
    path = resolve_config_path(args.config)
    raw = read_yaml(path)
    config = validate(raw, [f"{k}={v}" for k, v in _dialect_overrides(args, overrides, raw)],
                      worker_num=worker_num, source=path)
    threads = cpu_threads(config, worker_num)
    pynative_sync(config)
    trainer = Trainer(config, worker_num=worker_num)
    trainer.setup()
    jit = trainer.shape.jit
    batches = trainer.inputs.batches()
    batch = model_args(next(batches), Tensor)
    model, params = trainer.model, trainer.params

    step_fn = trainer.step_fn
    host_sum = None
    try:
        apply = _closure(step_fn, "apply")
    except ValueError:      # dp's gradient sum on the host between two graphs (training/steps.py HostDataSum)
        host_sum = _closure(step_fn, "host_sum")
        apply = getattr(_closure(step_fn, "apply_fn"), "__wrapped__", _closure(step_fn, "apply_fn"))
    update = _closure(apply, "finish")
    update_obj = getattr(update, "__self__", update)        # PyNative: the bound GradientUpdate.eager
    grad_fn = ms.value_and_grad(model, None, params)
    grads_fn = compile_blocking(grad_fn, cells=[model]) if jit else grad_fn
    apply_fn = compile_blocking(apply) if jit else apply
    reduce_fn = compile_blocking(update_obj.reduce) if jit else update_obj.reduce
    state = {}

    def run_step():
        loss, norm = step_fn(*batch)
        float(loss), None if norm is None else float(norm)

    def run_grads():
        loss, grads = grads_fn(*batch)
        float(loss)
        state["grads"], state["loss"] = (ms.mutable(tuple(grads)) if jit else tuple(grads)), loss

    def summed():       # the host sum is part of the update and of the reduce (the one-graph step's all-reduce)
        grads = state["grads"] if host_sum is None else host_sum(state["grads"])
        return ms.mutable(tuple(grads)) if jit and host_sum is not None else grads

    def run_update():
        loss, norm = apply_fn(summed(), state["loss"])
        float(loss)

    def run_reduce():
        out = reduce_fn(summed(), state["loss"])
        float(out[1])

    # the collectives the step issues: grads and update once, eagerly, the primitives wrapped
    ms.set_context(mode=ms.PYNATIVE_MODE)
    log = CollectiveLog()
    try:
        loss, grads = grad_fn(*batch)
        in_grads = len(log.calls)
        update_obj.eager(tuple(grads), loss)
    finally:
        log.restore()
    calls = log.calls
    distinct = {}
    for i, c in enumerate(calls):
        entry = distinct.setdefault(c, {"count_grads": 0, "count_update": 0})
        entry["count_grads" if i < in_grads else "count_update"] += 1
    world = trainer.world
    from mindformers_core.distributed.process_group import world_group
    from mindformers_core.distributed.comm import kernels as K
    one = Tensor([1.0], ms.float32)

    barrier_graph = ms.jit(K.AllReduceKernel(world_group(), "sum")) if world > 1 else None

    def sync():
        """A one-float all-reduce: both ranks there (nothing on one process)."""
        return barrier_graph(one).asnumpy() if barrier_graph is not None else None
    replays = {c: _replay_cell(*c) for c in distinct} if world > 1 else {}

    parts = {"step": run_step, "grads": run_grads, "update": run_update, "reduce": run_reduce}
    times = {k: [] for k in parts}
    cpus = {k: [] for k in parts}
    waits, idle = [], []
    coll = {c: [] for c in replays if replays[c] is not None}
    run_grads()                 # compile (and the gradients the update parts take)
    for i in range(warmup + rounds):
        record = i >= warmup
        for name, fn in parts.items():
            sync()
            t, c = _timed(fn)
            if name == "step" and world > 1:
                w, _ = _timed(sync)              # waiting for the peer's step to end
                v, _ = _timed(sync)              # the same collective with nobody late: its own cost
                if record:
                    waits.append(w)
                    idle.append(v)
            if record:
                times[name].append(t)
                cpus[name].append(c)
        for key, fn in replays.items():
            if fn is None:
                continue
            sync()
            t, _ = _timed(fn)
            if record:
                coll[key].append(t)
    med = lambda xs: statistics.median(xs) if xs else None      # noqa: E731
    return {"rank": trainer.rank, "world": world, "jit": jit, "threads": threads.value if threads else None,
            "parts": {k: {"wall_s": med(times[k]), "cpu_s": med(cpus[k]), "wall_all": times[k], "cpu_all": cpus[k]}
                      for k in parts},
            "barrier_s": med(waits), "barrier_idle_s": med(idle),
            "collectives": [{"kind": c[0], "shape": list(c[1]), "dtype": c[2], "group": c[3], "op": c[4],
                             "count_grads": d["count_grads"], "count_update": d["count_update"],
                             "alone_s": med(coll.get(c, []))} for c, d in distinct.items()]}
