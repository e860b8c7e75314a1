"""Worker side of the MoE x pipeline parity test: a 4-layer GPT (layer 0 dense, layers 1-3 mixtures of
4 experts, top-2, shared expert, sequence-level load-balancing loss, dropless) cut into pipeline stages,
each stage parallelized over its own ranks (data parallel with the experts split over ``ep`` inside it),
run by 1F1B (2 stages) or DualPipeV (4 stages in a V, two per rank) for 2 momentum-SGD steps. The
loss each rank's runtime returns (the last stage's, plus the load-balancing loss of the stages before
it, kept where it was made) is summed over the pipeline ranks as the trainer logs it."""
import re

import numpy as np
import mindspore as ms
from mindspore import Tensor, nn

from mindformers_core.distributed import comm, get_env
from mindformers_core.distributed.process_group import new_group
from mindformers_core.pipeline import Schedule1F1B, ScheduleDualPipeV
from mindformers_core.pipeline.runtime import PipelineStage
from mindformers_core.sharding import Layout, expert_mesh
from mindformers_core.sharding.annotations import global_shape_of, layout_of
from mindformers_core.sharding.parallelizer import GradientReducer, parallelize
from mindformers_core.transformer import GPTModel, TransformerConfig
from tests.bodies.gpt_tp_body import train

STEPS, SEQ, BATCH, VOCAB = 2, 16, 8, 256


def make_config(dp=1, ep=1, pp=1, vpp=None):
    return TransformerConfig(num_layers=4, hidden_size=32, ffn_hidden_size=64, num_attention_heads=4,
                             num_query_groups=2, vocab_size=VOCAB, seq_length=SEQ, data_parallel_size=dp,
                             num_moe_experts=4, moe_router_topk=2, moe_ffn_hidden_size=32,
                             moe_shared_expert_intermediate_size=32, moe_aux_loss_coeff=0.01,
                             moe_router_load_balancing_type="seq_aux_loss", moe_first_k_dense_layers=1,
                             expert_model_parallel_size=ep, pipeline_model_parallel_size=pp,
                             virtual_pipeline_model_parallel_size=vpp)


def batches():
    rng = np.random.RandomState(11)
    pair = [rng.randint(0, VOCAB, (BATCH, SEQ + 1)).astype(np.int32) for _ in range(2)]
    return [pair[i % 2] for i in range(STEPS)]


def reference(modes=("pynative", "jit")):
    """One process, the whole model on the whole batch: losses (CE + aux) and final weights."""
    out = {}
    for mode in modes:
        ms.set_seed(0)
        model = GPTModel(make_config())
        losses = train(model, batches(), lambda a: a, mode)
        out[mode] = {"losses": losses, "weights": {p.name: p.asnumpy() for p in model.trainable_params()}}
    return out


def _build_stage(cfg, s, pp, vpp, mesh, rank, micro, dp):
    ms.set_seed(0)
    model = GPTModel(cfg, pp_rank=s % pp, vp_stage=s // pp if vpp else None)
    ids = np.zeros((micro, SEQ), np.int32)
    stage_num = pp * (vpp or 1)
    if s == 0:
        parallelize(model, cfg, ids, mesh=mesh, rank=rank)
    else:
        dpx = "dp" if dp > 1 else "None"
        hidden = np.zeros((micro, SEQ, cfg.hidden_size), np.float32)
        samples, layouts = [hidden, ids], [mesh(dpx, "None", "None"), mesh(dpx, "None")]
        if s != stage_num - 1:
            samples, layouts = samples[:1], layouts[:1]
        parallelize(model, cfg, *samples, mesh=mesh, rank=rank, input_layouts=layouts)
    numbers = model.decoder.layer_numbers   # global layer names: unique on a rank holding two stages
    for p in model.trainable_params():
        p.name = re.sub(r"decoder\.layers\.(\d+)\.", lambda m_: f"decoder.layers.{numbers[int(m_.group(1))] - 1}.",
                        p.name)
    return model


def run(configs, modes=("pynative", "jit")):
    """``configs``: name -> {"pp", "dp", "ep", "schedule": "1f1b" | "dualpipev", "m", "modes"}."""
    rank = get_env().rank
    result = {}
    for name, kw in configs.items():
        pp, dp, ep, m = kw["pp"], kw.get("dp", 1), kw.get("ep", 1), kw["m"]
        dualpipe = kw["schedule"] == "dualpipev"
        vpp = 2 if dualpipe else None
        prank, local = divmod(rank, dp)
        stage_ranks = list(range(prank * dp, (prank + 1) * dp))
        pp_ranks = [local + r * dp for r in range(pp)]
        pp_group = new_group(pp_ranks)
        mesh = expert_mesh(dp, 1, 1, ep, stage_ranks) if ep > 1 else \
            Layout((dp, 1, 1), ("dp", "cp", "tp"), stage_ranks)
        stage_num = pp * (vpp or 1)
        my_stages = [prank, stage_num - 1 - prank] if dualpipe else [prank]
        for mode in kw.get("modes", modes):
            cfg = make_config(dp, ep, pp, vpp)
            models = {s: _build_stage(cfg, s, pp, vpp, mesh, rank, BATCH // m, dp) for s in my_stages}
            stages = [PipelineStage(models[s], s, stage_num, pp_ranks=pp_ranks, loss_in_cell=s == stage_num - 1)
                      for s in my_stages]
            sched = ScheduleDualPipeV(stages, m) if dualpipe else Schedule1F1B(stages[0], m)
            params = [p for st in stages for p in st.params]
            reducer = GradientReducer(params)
            opt = nn.Momentum(params, learning_rate=0.5, momentum=0.9)
            rows = slice(local * BATCH // dp, (local + 1) * BATCH // dp)
            first, last = 0 in my_stages, stage_num - 1 in my_stages
            losses = []
            for tokens in batches():
                x, y = tokens[rows, :-1], tokens[rows, 1:]
                loss = sched.run(Tensor(x) if first else None, Tensor(y) if last else None, mode=mode)
                mine = loss if loss is not None else ms.ops.zeros((), ms.float32)
                losses.append(float(comm.all_reduce(mine, "sum", pp_group).asnumpy()))   # as the trainer logs
                opt(reducer(tuple(g for st in stages for g in st.grads)))
            shards = {}
            for p in params:
                sl = layout_of(p).local_slice(global_shape_of(p), rank)
                shards[p.name] = (p.asnumpy(), [(a.start, a.stop) for a in sl], global_shape_of(p))
            local_aux = [st.local_loss_dtype is not None for st in stages]
            result[f"{name}/{mode}"] = {"losses": losses, "shards": shards, "local_aux": local_aux}
    return result
