"""Worker side of bench/moe.py: a GPT with MoE layers (or its dense twin) parallelized over the
msrun ranks (data parallel, experts over ep = all ranks), timed training steps under ms.jit, one
PyNative step with the all-to-all payload counted at the kernel, and the experts' load."""
import time

import numpy as np
import mindspore as ms
from mindspore import Tensor, nn

from mindformers_core.distributed import get_env
from mindformers_core.sharding import context_parallel as C
from mindformers_core.sharding.annotations import sharding_plan_of
from mindformers_core.sharding.parallelizer import GradientReducer, parallelize
from mindformers_core.transformer import GPTModel, TransformerConfig
from mindformers_core.transformer.moe import routers_of

_COUNT = {"bytes": 0}


def _instrument():
    """Count the payload each rank sends through an all-to-all: (n - 1) / n of its input (PyNative).
    The expert exchange is the differentiable all-to-all of sharding/context_parallel.py, whose
    backward kernels come from that module's backward twin: both are counted."""
    saved = []
    for module in (C, C._backward_twin()):
        cls = module._AllToAll
        orig = cls.construct
        saved.append((cls, orig))

        def construct(self, x, *rest, _orig=orig):
            if self.n > 1:
                _COUNT["bytes"] += int((self.n - 1) / self.n * x.size * x.itemsize)
            return _orig(self, x, *rest)
        cls.construct = construct

    def restore():
        for cls, orig in saved:
            cls.construct = orig
    return restore


def config(kind, dp, ep, h, layers, heads, vocab, seq, experts, topk, expert_ffn):
    common = dict(num_layers=layers, hidden_size=h, num_attention_heads=heads, vocab_size=vocab, seq_length=seq,
                  data_parallel_size=dp)
    if kind == "dense":          # the same active parameters per token: k experts' width
        return TransformerConfig(ffn_hidden_size=topk * expert_ffn, **common)
    return TransformerConfig(ffn_hidden_size=topk * expert_ffn, num_moe_experts=experts, moe_router_topk=topk,
                             moe_ffn_hidden_size=expert_ffn, moe_aux_loss_coeff=0.01, expert_model_parallel_size=ep,
                             **common)


def run(cases, batch, steps, h, layers, heads, vocab, seq, experts, topk, expert_ffn):
    env = get_env()
    rank, world = env.rank, env.world_size
    out = {}
    rng = np.random.RandomState(0)
    data = rng.randint(0, vocab, (batch, seq + 1)).astype(np.int32)
    for kind in cases:
        ms.set_seed(0)
        ep = world if kind == "moe" else 1
        cfg = config(kind, world, ep, h, layers, heads, vocab, seq, experts, topk, expert_ffn)
        model = GPTModel(cfg)
        parallelize(model, cfg, data[:, :-1], data[:, 1:])
        layout = sharding_plan_of(model).input_layouts[0]
        sl = layout.local_slice(data[:, :-1].shape, rank)
        ids, labels = Tensor(data[:, :-1][sl]), Tensor(data[:, 1:][sl])
        params = model.trainable_params()
        opt = nn.AdamWeightDecay(params, 1e-3)
        reducer = GradientReducer(params)
        grad_fn = ms.value_and_grad(model, None, params)

        def step(a, b):
            loss, grads = grad_fn(a, b)
            opt(reducer(grads))
            return loss

        restore = _instrument()                         # one PyNative step: count the all-to-all payload
        _COUNT["bytes"] = 0
        step(ids, labels).asnumpy()
        restore()
        counted = _COUNT["bytes"]
        for _, r in routers_of(model):
            r.tokens_per_expert.set_data(Tensor(np.zeros(r.num_experts, np.float32)))
        jitted = ms.jit(step)
        jitted(ids, labels).asnumpy()                   # compile
        t0 = time.perf_counter()
        for _ in range(steps):
            loss = jitted(ids, labels)
        loss = float(loss.asnumpy())
        dt = (time.perf_counter() - t0) / steps
        load = [r.tokens_per_expert.asnumpy().tolist() for _, r in routers_of(model)]
        out[kind] = {"step_s": dt, "loss": loss, "a2a_bytes": counted, "load": load,
                     "params": int(sum(p.size for p in params))}
    return out
