"""Worker side of the pipeline x tensor (x data) parallel GPT test: each pipeline stage is a
GPTModel built for its layers and parallelized over its own ranks by the layers' shard()
declarations; the 1F1B runtime moves activations between stages."""
import re

import numpy as np
import mindspore as ms
from mindspore import Tensor, nn

from mindformers_core.distributed import get_env
from mindformers_core.pipeline import Schedule1F1B
from mindformers_core.pipeline.runtime import PipelineStage
from mindformers_core.sharding import Layout
from mindformers_core.sharding.annotations import global_shape_of, layout_of
from mindformers_core.sharding.parallelizer import GradientReducer, parallelize
from mindformers_core.transformer import GPTModel
from tests.bodies.gpt_tp_body import batches, make_config


def run(pp, dp, tp, sp=False, modes=("pynative", "jit"), micro_batch_num=2):
    rank = get_env().rank
    per_stage = dp * tp
    stage, local = divmod(rank, per_stage)
    stage_ranks = list(range(stage * per_stage, (stage + 1) * per_stage))
    pp_ranks = [local + s * per_stage for s in range(pp)]
    mesh = Layout((dp, 1, tp), ("dp", "cp", "tp"), stage_ranks)
    last = stage == pp - 1
    result = {}
    for mode in modes:
        ms.set_seed(0)
        cfg = make_config(dp, tp, sp)
        cfg.pipeline_model_parallel_size = pp
        model = GPTModel(cfg, pp_rank=stage)
        data = batches()
        full_b, seq = data[0].shape[0], data[0].shape[1] - 1
        micro = full_b // micro_batch_num
        ids = np.zeros((micro, seq), np.int32)
        hidden = np.zeros((micro, seq, cfg.hidden_size), np.float32)
        dpx = "dp" if dp > 1 else "None"
        if stage == 0:
            parallelize(model, cfg, ids, mesh=mesh, rank=rank)
        else:
            h_layout = mesh(dpx, "tp" if sp else "None", "None")
            parallelize(model, cfg, hidden, ids, mesh=mesh, rank=rank,
                        input_layouts=[h_layout, mesh(dpx, "None")])
        st = PipelineStage(model, stage, pp, pp_ranks=pp_ranks, loss_in_cell=last)
        sched = Schedule1F1B(st, micro_batch_num)
        reducer = GradientReducer(list(st.params))
        opt = nn.Momentum(list(st.params), learning_rate=0.5, momentum=0.9)
        rows = slice(local // tp * full_b // dp, (local // tp + 1) * full_b // dp)
        losses = []
        for tokens in data:
            x, y = tokens[rows, :-1], tokens[rows, 1:]
            loss = sched.run(Tensor(x) if stage == 0 else None, Tensor(y) if last else None, mode=mode)
            losses.append(None if loss is None else float(loss.asnumpy()))
            opt(reducer(st.grads))
        numbers = model.decoder.layer_numbers
        shards = {}
        for p in st.params:
            name = re.sub(r"decoder\.layers\.(\d+)\.",
                          lambda m_: f"decoder.layers.{numbers[int(m_.group(1))] - 1}.", p.name)
            sl = layout_of(p).local_slice(global_shape_of(p), rank)
            shards[name] = (p.asnumpy(), [(s.start, s.stop) for s in sl], global_shape_of(p))
        result[f"pp{pp}_dp{dp}_tp{tp}{'_sp' if sp else ''}/{mode}"] = {"losses": losses, "shards": shards}
    return result
