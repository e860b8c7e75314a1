"""Worker side of bench/pipeline.py: time every step of a few pipeline training steps and read what
the runtime held (``runtime.memory``) in the last one."""
import time

import numpy as np
import mindspore as ms
from mindspore import Tensor, nn, ops

from mindformers_core import pipeline as pp
from mindformers_core.distributed import get_env
from mindformers_core.pipeline.runtime import PipelineStage
from mindformers_core.recompute import allocator_peak

SCHEDULES = pp.BUILTIN_SCHEDULES


def mse(out, y):
    return ((out - y) ** 2).mean()


def build_layers(layers, width):
    ms.set_seed(0)
    return [nn.Dense(width, width, activation="tanh") for _ in range(layers)]


def data(batch, width):
    rng = np.random.default_rng(0)
    return (Tensor(rng.standard_normal((batch, width)).astype(np.float32)),
            Tensor(rng.standard_normal((batch, width)).astype(np.float32)))


def run(schedules, micro_batch_nums, mode, width, layers, batch, warmup=1, steps=3, threads=None,
        recompute=False):
    if threads:
        ms.device_context.cpu.op_tuning.threads_num(threads)
    env = get_env()
    pp_size = env.world_size
    x, y = data(batch, width)
    rows = []
    for name in schedules:
        cls, per_rank, placement = SCHEDULES[name]
        stage_num = pp_size * per_rank
        for m in micro_batch_nums:
            blocks = build_layers(layers, width)
            per_stage = layers // stage_num
            infos = pp.stages_of_rank(env.rank, pp_size, per_rank, placement)
            stages = [PipelineStage(nn.SequentialCell(blocks[i.stage_index * per_stage:(i.stage_index + 1) * per_stage]),
                                    i.stage_index, stage_num, loss_fn=mse, recompute=recompute)
                      for i in infos]
            sched = cls(stages[0], m) if per_rank == 1 else cls(stages, m)
            held = {st.stage_index for st in stages}
            args = (x if 0 in held else None, y if stage_num - 1 in held else None)
            runtime = sched.runtime(mode)
            for _ in range(warmup):
                sched.run(*args, mode=mode)
            runtime.record, runtime.trace = True, []
            walls = []
            for _ in range(steps):
                start = time.perf_counter()
                sched.run(*args, mode=mode)
                ms.runtime.synchronize()
                walls.append(time.perf_counter() - start)
            durations = {}
            for step, t0, t1 in runtime.trace:
                durations.setdefault(step.type.name, []).append(t1 - t0)
            compute = sum(sum(durations.get(k, [])) for k in ("FWD", "BWD", "BWD_INPUT", "BWD_WEIGHT"))
            comm = [d for k in ("FWD_SEND", "FWD_RECV", "BWD_SEND", "BWD_RECV") for d in durations.get(k, [])]
            rows.append({"schedule": name, "micro_batch_num": m, "rank": env.rank,
                         "wall": float(np.mean(walls)), "busy": compute / steps,
                         "mean": {k: float(np.mean(v)) for k, v in durations.items()},
                         "comm_min": float(np.min(comm)) if comm else 0.0,
                         # every recorded step: [type, micro, stage, start, end] (perf_counter seconds,
                         # one clock for all ranks of this host)
                         "trace": [[st.type.name, st.micro_index, st.stage_index, t0, t1]
                                   for st, t0, t1 in runtime.trace],
                         "memory": runtime.memory.as_dict(), "allocator_peak": allocator_peak(),
                         "input_bytes": int(x.nbytes) // m})
    return rows


def single_process_step(width, layers, batch, mode, steps=3):
    """Whole model, whole batch, one process: the baseline step time."""
    net = nn.SequentialCell(build_layers(layers, width))
    params = net.trainable_params()
    x, y = data(batch, width)

    def objective(a, b):
        return mse(net(a), b)
    fn = ms.value_and_grad(objective, None, params)
    step = ms.jit(fn) if mode == "jit" else fn
    step(x, y)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        loss, grads = step(x, y)
        ops.stack([g.sum() for g in grads]).asnumpy()
        times.append(time.perf_counter() - start)
    return float(np.mean(times))
