"""Worker side of hsdp composed with the pipeline runtime: the tiny GPT split into 2 stages, each
replicated over 2 ranks (pp2 x dp2 on 4 ranks) and sharded by hsdp over its own dp group; 1F1B
with 2 microbatches, AdamW, global-norm clipping. Returns losses, norms, final weights (by global
name) and what was held and communicated, for the test to compare with one process."""
import re
import time

import numpy as np
import mindspore as ms
from mindspore import Tensor

from mindformers_core.distributed import comm, get_env
from mindformers_core.distributed.process_group import new_group
from mindformers_core.hsdp import hsdp
from mindformers_core.optim import AdamW, clip_grad_norm
from mindformers_core.pipeline import Schedule1F1B
from mindformers_core.pipeline.runtime import PipelineStage
from mindformers_core.sharding import Layout
from mindformers_core.sharding.parallelizer import parallelize
from mindformers_core.transformer import GPTModel
from tests.bodies.gpt_tp_body import batches, make_config

LR = 1e-3
PP, DP = 2, 2
THRESHOLD_KB = 0.5     # the 64-element biases and norm weights (0.25 KB) stay replicated


def reference(max_norm):
    """One process, the whole model on the global batch: losses, gradient norms, final weights."""
    ms.set_seed(0)
    model = GPTModel(make_config())
    params = model.trainable_params()
    opt = AdamW(params, LR)
    grad_fn = ms.value_and_grad(model, None, params)
    losses, norms = [], []
    for tokens in batches():
        loss, grads = grad_fn(Tensor(tokens[:, :-1]), Tensor(tokens[:, 1:]))
        grads, norm = clip_grad_norm(grads, max_norm)
        opt(grads)
        losses.append(float(loss.asnumpy()))
        norms.append(float(norm.asnumpy()))
    return {"losses": losses, "norms": norms, "weights": {p.name: p.asnumpy() for p in params}}


def _global_name(model, name):
    numbers = model.decoder.layer_numbers
    return re.sub(r"decoder\.layers\.(\d+)\.",
                  lambda m: f"decoder.layers.{numbers[int(m.group(1))] - 1}.", name)


def _stage(stage, last, pp_ranks, stage_ranks, dp_group, micro_batch_num, parallelized):
    """This rank's PipelineStage: replicated over ``dp_group`` (the runtime's data parallel), or
    sharded by ``parallelize`` over a stage mesh with a dp axis (hsdp then finds the dp group in
    the sharding plan and sums the plan's dp-partial gradients)."""
    ms.set_seed(0)
    cfg = make_config(DP if parallelized else 1, 1)
    cfg.pipeline_model_parallel_size = PP
    model = GPTModel(cfg, pp_rank=stage)
    if not parallelized:
        return model, PipelineStage(model, stage, PP, pp_ranks=pp_ranks, loss_in_cell=last, dp_group=dp_group)
    rank = get_env().rank
    mesh = Layout((DP, 1, 1), ("dp", "cp", "tp"), stage_ranks)
    full_b, seq = batches()[0].shape[0], batches()[0].shape[1] - 1
    ids = np.zeros((full_b // micro_batch_num, seq), np.int32)     # one global microbatch
    if stage == 0:
        parallelize(model, cfg, ids, mesh=mesh, rank=rank)
    else:
        hidden = np.zeros(ids.shape + (cfg.hidden_size,), np.float32)
        parallelize(model, cfg, hidden, ids, mesh=mesh, rank=rank,
                    input_layouts=[mesh("dp", "None", "None"), mesh("dp", "None")])
    return model, PipelineStage(model, stage, PP, pp_ranks=pp_ranks, loss_in_cell=last)


def run(levels=("level1", "level2", "level3"), modes=("pynative", "jit"), max_norm=1.0,
        micro_batch_num=2, shard_size=2, parallelized=False, configs=None):
    """Every (level, mode) of ``levels`` x ``modes``, or the ``configs`` given as
    ``[level, mode, parallelized]``; results keyed ``level/mode`` (``+parallelized`` for those)."""
    rank = get_env().rank
    stage, local = divmod(rank, DP)                       # ranks [0, 1] hold stage 0, [2, 3] stage 1
    stage_ranks = list(range(stage * DP, (stage + 1) * DP))
    pp_ranks = [local + s * DP for s in range(PP)]
    last = stage == PP - 1
    dp_group = new_group(stage_ranks)
    # count the runtime's own data-parallel all-reduces: hsdp must replace them, not add to them
    runtime_reductions = [0]
    plain_all_reduce = comm.all_reduce

    def counting_all_reduce(*args, **kwargs):
        runtime_reductions[0] += 1
        return plain_all_reduce(*args, **kwargs)
    comm.all_reduce = counting_all_reduce
    out = {}
    try:
        if configs is None:
            configs = [(level, mode, parallelized) for level in levels for mode in modes]
        for level, mode, parallelized in configs:
            runtime_reductions[0] = 0
            start = time.perf_counter()
            model, st = _stage(stage, last, pp_ranks, stage_ranks, dp_group, micro_batch_num, parallelized)
            sched = Schedule1F1B(st, micro_batch_num)
            units = ["*decoder.layers.*"] if level == "level3" else None   # a layer = one unit
            wrapped = hsdp(st, shard_size=shard_size, threshold=THRESHOLD_KB, optimizer_level=level, units=units)
            opt = AdamW(wrapped.trainable_params(), LR)
            step = wrapped.train_step(sched, opt, mode=mode, max_grad_norm=max_norm)
            data = batches()
            rows = data[0].shape[0] // DP
            mine = slice(local * rows, (local + 1) * rows)
            losses, norms = [], []
            for tokens in data:
                loss = step(Tensor(tokens[mine, :-1]) if stage == 0 else None,
                            Tensor(tokens[mine, 1:]) if last else None)
                losses.append(None if loss is None else float(loss.asnumpy()))
                norms.append(float(step.grad_norm.asnumpy()))
            held = {_global_name(model, p.name): tuple(p.shape) for p in st.params}
            states = {_global_name(model, p.name): [tuple(s.shape) for s in opt.state_of(i)]
                      for i, p in enumerate(opt.parameters)}
            sharded = {_global_name(model, p.name): wrapped.plan_of(p).sharded for p in st.params}
            gathers = wrapped.units.gathers if wrapped.units is not None else 0
            units = len(wrapped.units.units) if wrapped.units is not None else 0
            full = wrapped.gather_full_params()
            out[f"{level}/{mode}" + ("+parallelized" if parallelized else "")] = {
                "stage": stage, "losses": losses, "norms": norms, "held": held, "states": states,
                "sharded": sharded, "collectives": wrapped.collective_count(), "gathers": gathers,
                "units": units,
                "runtime_reductions": runtime_reductions[0], "seconds": time.perf_counter() - start,
                "weights": {_global_name(model, n): v for n, v in full.items()}}
    finally:
        comm.all_reduce = plain_all_reduce
    return out
