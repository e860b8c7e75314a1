"""Worker side of the expert-parallel MoE parity test: a 2-layer GPT whose second layer is a
mixture of experts (4 experts, top-2, shared expert, sequence-level or global aux loss, dropless), with the
experts split over ``ep`` (optionally with more data parallel or dense tensor parallel), trained 2
momentum-SGD steps in PyNative and jit; returns losses and this rank's weight shards to merge."""
import numpy as np
import mindspore as ms

from mindformers_core.distributed import get_env
from mindformers_core.sharding.annotations import global_shape_of, layout_of, sharding_plan_of
from mindformers_core.sharding.parallelizer import parallelize
from mindformers_core.transformer import GPTModel, TransformerConfig
from tests.bodies.gpt_tp_body import train

STEPS, SEQ, BATCH, VOCAB = 2, 16, 4, 256


def make_config(dp=1, ep=1, tp=1, sp=False, experts=4, group=None, balance="seq_aux_loss"):
    extra = {"moe_router_num_groups": 2, "moe_router_group_topk": 1, "moe_router_score_function": "sigmoid"} \
        if group else {}
    return TransformerConfig(num_layers=2, hidden_size=32, ffn_hidden_size=64, num_attention_heads=4,
                             num_query_groups=2, vocab_size=VOCAB, seq_length=SEQ, data_parallel_size=dp,
                             tensor_model_parallel_size=tp, sequence_parallel=sp, num_moe_experts=experts,
                             moe_router_topk=2, moe_ffn_hidden_size=32, moe_shared_expert_intermediate_size=32,
                             moe_aux_loss_coeff=0.01, moe_router_load_balancing_type=balance,
                             moe_first_k_dense_layers=1, expert_model_parallel_size=ep,
                             **extra)


def batches():
    rng = np.random.RandomState(11)
    pair = [rng.randint(0, VOCAB, (BATCH, SEQ + 1)).astype(np.int32) for _ in range(2)]
    return [pair[i % 2] for i in range(STEPS)]


def reference(modes=("pynative", "jit"), **kw):
    out = {}
    for mode in modes:
        ms.set_seed(0)
        model = GPTModel(make_config(**kw))
        losses = train(model, batches(), lambda a: a, mode)
        out[mode] = {"losses": losses, "weights": {p.name: p.asnumpy() for p in model.trainable_params()}}
    return out


def run(configs, modes=("pynative", "jit")):
    """``configs``: name -> dict of ``make_config`` keyword arguments (``"modes"``: this config's modes)."""
    rank = get_env().rank
    result = {}
    for name, kw in configs.items():
        kw = dict(kw)
        for mode in kw.pop("modes", modes):
            ms.set_seed(0)
            config = make_config(**kw)
            model = GPTModel(config)
            sample = batches()[0]
            parallelize(model, config, sample[:, :-1], sample[:, 1:])
            layout = sharding_plan_of(model).input_layouts[0]
            shape = sample[:, :-1].shape
            losses = train(model, batches(), lambda a: a[layout.local_slice(shape, rank)], mode)
            shards = {}
            for p in model.trainable_params():
                sl = layout_of(p).local_slice(global_shape_of(p), rank)
                shards[p.name] = (p.asnumpy(), [(s.start, s.stop) for s in sl], global_shape_of(p))
            result[f"{name}/{mode}"] = {"losses": losses, "shards": shards,
                                        "plan": sharding_plan_of(model).explain() if mode == "pynative" else ""}
    return result


def run_trainer(yaml, out_root, argv, modes=(1, 0)):
    """``run_mindformer.main`` with ``argv`` on every worker, once per ``context.mode``; rank 0 returns
    the ``loss.jsonl`` records of each run."""
    import json
    import os
    import run_mindformer
    out = {}
    for mode in modes:
        target = os.path.join(out_root, f"mode{mode}")
        code = run_mindformer.main(["--config", yaml, "--output_dir", target, *map(str, argv), "--context.mode",
                                    str(mode)])
        if code != 0:
            raise RuntimeError(f"run_mindformer.main returned {code} (context.mode {mode})")
        if get_env().rank == 0:
            with open(os.path.join(target, "loss.jsonl")) as f:
                out[mode] = [json.loads(line) for line in f]
    return out
