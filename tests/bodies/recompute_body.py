"""Worker side of the recompute/swap pipeline test: a 4-layer GPT split over 2 pipeline ranks
(GPTModel(config, pp_rank=r) builds rank r's stage), one 1F1B step with 2 microbatches, with each
recompute/swap configuration applied to the stage; returns the loss, every gradient and the
report's units so the parent can compare them with the run without recompute."""
import time

import numpy as np
import mindspore as ms
from mindspore import Tensor

from mindformers_core.distributed import get_env
from mindformers_core.pipeline import Schedule1F1B
from mindformers_core.pipeline.runtime import PipelineStage
from mindformers_core.recompute import RecomputeConfig, apply_recompute, apply_swap
from mindformers_core.transformer import GPTModel, TransformerConfig, VocabParallelCrossEntropy

B, S, V = 4, 16, 64

CONFIGS = {
    "none": (None, None),
    # whole layers 1-2 (one on each stage: global layer ids) + the attention core and the MLP
    # activation everywhere else
    "mixed": (RecomputeConfig(select=["core_attention", "mlp.act"], full_layers="1-2"), None),
    "stage": (RecomputeConfig(mode="full", granularity="stage"), None),
    "swap": (None, ["core_attention", "mlp.act"]),
}


def make_config():
    return TransformerConfig(num_layers=4, hidden_size=32, num_attention_heads=4, num_query_groups=2, vocab_size=V,
                             seq_length=S, ffn_hidden_size=48, pipeline_model_parallel_size=2)


def _batch():
    rng = np.random.RandomState(7)
    return Tensor(rng.randint(0, V, (B, S)), ms.int32), Tensor(rng.randint(0, V, (B, S)), ms.int32)


def one(name, mode):
    start = time.perf_counter()
    rank = get_env().rank
    recompute, swap = CONFIGS[name]
    ms.set_seed(0)
    model = GPTModel(make_config(), pp_rank=rank)
    units = []
    if recompute is not None:
        units += apply_recompute(model, recompute).names
    if swap is not None:
        units += [f"swap:{n}" for n in apply_swap(model, swap).names]
    stage = PipelineStage(model, rank, 2, loss_fn=VocabParallelCrossEntropy() if rank == 1 else None)
    ids, labels = _batch()
    loss = Schedule1F1B(stage, 2).run(ids if rank == 0 else None, labels if rank == 1 else None, mode=mode)
    names = [p.name for p in stage.params]
    return {"loss": None if loss is None else float(loss.asnumpy()), "units": units,
            "grads": {n: g.asnumpy() for n, g in zip(names, stage.grads)}, "seconds": time.perf_counter() - start}


def run(modes, configs):
    return {(mode, name): one(name, mode) for mode in modes for name in configs[mode]}
