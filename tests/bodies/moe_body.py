"""Worker side of the expert-parallel MoE parity test: a 2-layer GPT whose second layer is a
mixture of experts (4 experts, top-2, shared expert, sequence-level or global aux loss, dropless), with the
experts split over ``ep`` (optionally with more data parallel or dense tensor parallel), trained 2
momentum-SGD steps in PyNative and jit; returns losses and this rank's weight shards to merge."""
import time

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


def build(dead_expert=None, **kw):
    """The MoE GPT of ``make_config(**kw)``; ``dead_expert``: that expert is never chosen (an expert bias of
    -100 on it, which steers the choice only: the routing of every other row is unchanged)."""
    config = make_config(**kw)
    if dead_expert is not None:
        config.moe_router_enable_expert_bias = True
    model = GPTModel(config)
    if dead_expert is not None:
        from mindspore import Tensor
        from mindformers_core.transformer.moe import routers_of
        for _, router in routers_of(model):
            bias = np.zeros(router.num_experts, np.float32)
            bias[dead_expert] = -100.0
            router.expert_bias.set_data(Tensor(bias))
    return config, model


def reference(modes=("pynative", "jit"), **kw):
    out = {}
    for mode in modes:
        ms.set_seed(0)
        _, model = build(**kw)
        losses = train(model, batches(), lambda a: a, mode)
        out[mode] = {"losses": losses, "weights": {p.name: p.asnumpy() for p in model.trainable_params()}}
    return out


def run(configs, modes=("pynative", "jit")):
    """``configs``: name -> dict of ``build`` keyword arguments (``"modes"``: this config's modes;
    ``"jit_variable": False``: jit runs the padded exchange instead of the graph-mode variable one)."""
    rank = get_env().rank
    result = {}
    for name, kw in configs.items():
        kw = dict(kw)
        jit_variable = kw.pop("jit_variable", True)
        for mode in kw.pop("modes", modes):
            ms.set_seed(0)
            config, model = build(**kw)
            sample = batches()[0]
            parallelize(model, config, sample[:, :-1], sample[:, 1:])
            for _, cell in model.cells_and_names():
                if hasattr(cell, "jit_variable"):       # False: jit takes the padded path (ExpertParallelExperts)
                    cell.jit_variable = jit_variable
            layout = sharding_plan_of(model).input_layouts[0]
            shape = sample[:, :-1].shape
            start = time.perf_counter()
            losses = train(model, batches(), lambda a: a[layout.local_slice(shape, rank)], mode)
            seconds = time.perf_counter() - start      # compile included (the suite's cost of this config)
            shards = {}
            for p in model.trainable_params():
                sl = layout_of(p).local_slice(global_shape_of(p), rank)
                shards[p.name] = (p.asnumpy(), [(s.start, s.stop) for s in sl], global_shape_of(p))
            result[f"{name}/{mode}"] = {"losses": losses, "shards": shards, "counts": _expert_counts(model), "seconds": seconds,
                                        "plan": sharding_plan_of(model).explain() if mode == "pynative" else ""}
    return result


def _expert_counts(model):
    """Per expert-parallel kernel, the (P, E) routed-row count matrix of its last variable-count exchange:
    ``eager`` as PyNative's path read it on the host, ``graph`` as the jit path recorded it in the graph (None
    where that path did not run), and the graph path's forward wire rows (``sent_rows``, ``buffer_rows``)."""
    from mindformers_core.sharding.expert_parallel import ExpertParallelExperts
    out = []
    for _, c in model.cells_and_names():
        if isinstance(c, ExpertParallelExperts):
            graph, wire = c.graph_counts()
            out.append({"eager": None if c.last_counts is None else c.last_counts.tolist(),
                        "graph": None if graph is None else graph.tolist(), **wire})
    return out


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


# ---- checkpoints across expert-parallel sizes ------------------------------------------------------------
def _bias_config(**kw):
    config = make_config(**kw)
    config.moe_router_enable_expert_bias = True       # the expert bias is saved beside the weights
    return config


def _state(model):
    from mindformers_core.training.checkpointing import state_params_of
    return list(model.trainable_params()) + state_params_of([model])


def ep1_checkpoint(directory):
    """One process: the MoE GPT with weights and expert bias moved off their initial values (so a load that
    did nothing is caught), saved as step 1 of ``directory``. Returns the saved values and their loss."""
    from mindspore import Tensor
    from mindformers_core.checkpoint import save_checkpoint
    ms.set_seed(0)
    model = GPTModel(_bias_config())
    rng = np.random.RandomState(3)
    saved = {}
    for p in _state(model):
        value = p.asnumpy() + 0.05 * rng.standard_normal(p.shape).astype(np.float32)
        p.set_data(Tensor(value))
        saved[p.name] = value
    save_checkpoint(directory, 1, saved, rank=0, world_size=1)
    tokens = batches()[0]
    return saved, float(model(Tensor(tokens[:, :-1]), Tensor(tokens[:, 1:])))


def run_checkpoint_ep(ep1_dir, ep2_dir):
    """4 ranks: the ep1 checkpoint loaded into dp4 = edp2 x ep2 (experts split over 2 ranks) and saved from
    there (each rank writes its experts), that ep2 checkpoint loaded into ep4 (one expert per rank). Returns per
    load this rank's values with their global slices and the loaded model's loss on the first batch."""
    from mindspore import Tensor
    from mindformers_core.checkpoint import load_checkpoint, save_checkpoint
    from mindformers_core.training.checkpointing import set_parameter
    rank = get_env().rank
    tokens = batches()[0]
    out = {}
    for name, ep, source in (("ep2_from_ep1", 2, ep1_dir), ("ep4_from_ep2", 4, ep2_dir)):
        ms.set_seed(0)
        config = _bias_config(dp=4, ep=ep)
        model = GPTModel(config)
        parallelize(model, config, tokens[:, :-1], tokens[:, 1:])
        params = _state(model)
        targets = {p.name: (global_shape_of(p), layout_of(p)) for p in params}
        values = load_checkpoint(source, targets, rank)
        for p in params:
            set_parameter(p, values[p.name])
        layout = sharding_plan_of(model).input_layouts[0]
        rows = layout.local_slice(tokens[:, :-1].shape, rank)
        loss = float(model(Tensor(tokens[:, :-1][rows]), Tensor(tokens[:, 1:][rows])))
        shards = {}
        for p in params:
            sl = layout_of(p).local_slice(global_shape_of(p), rank)
            shards[p.name] = (p.asnumpy(), [(s.start, s.stop) for s in sl], global_shape_of(p))
        out[name] = {"shards": shards, "loss": loss,
                     "expert_shape": next(tuple(p.shape) for p in params if p.name.endswith("experts.w_gate"))}
        if ep == 2:
            save_checkpoint(ep2_dir, 1, {p.name: p.asnumpy() for p in params}, {p.name: layout_of(p) for p in params})
    return out


# ---- the variable-count all-to-all on its own --------------------------------------------------------------
def run_all_to_all_v(cases):
    """``all_to_all_v`` over the world with each case's (P, P) send-count matrix (rows of width 3 that name
    their source, destination and position), forward and the gradient of ``sum(y * w)``; returns what this
    rank received, its gradient and the count matrix the exchange agreed on."""
    from mindspore import Tensor
    from mindformers_core.distributed.comm import all_to_all_v, gather_counts
    from mindformers_core.distributed.process_group import world_group
    rank = get_env().rank
    out = []
    for matrix in cases:
        m = np.asarray(matrix)
        rows = np.array([[rank, j, t] for j in range(len(m)) for t in range(m[rank, j])], np.float32).reshape(-1, 3)
        weight = Tensor(np.arange(3 * m[:, rank].sum(), dtype=np.float32).reshape(-1, 3) + 1 + 100 * rank)

        def f(x):
            return (all_to_all_v(x, m[rank], None) * weight).sum()
        received = all_to_all_v(Tensor(rows), m[rank], None)
        grad = ms.grad(f)(Tensor(rows))
        out.append({"received": received.asnumpy(), "grad": grad.asnumpy(), "weight": weight.asnumpy(),
                    "rows": rows, "agreed": gather_counts(world_group(), m[rank]).tolist()})
    return out
