"""Worker side of bench/tp.py: the tiny Llama parallelized by its shard() declarations at one
tensor-parallel size; times steps and counts the bytes every collective moves."""
import time

import numpy as np
import mindspore as ms
from mindspore import Tensor

from mindformers_core.distributed import get_env
from mindformers_core.distributed.comm import kernels as K
from mindformers_core.optim import AdamW
from mindformers_core.sharding.annotations import global_shape_of, layout_of, sharding_plan_of
from mindformers_core.sharding.parallelizer import GradientReducer, parallelize
from mindformers_core.transformer import GPTModel, TransformerConfig

_COUNT = {"bytes": 0, "calls": 0}


def _instrument():
    """Count, in PyNative, the bytes each collective sends per rank (ring algorithms: all-reduce
    2(n-1)/n of the tensor, all-gather (n-1) x the local piece, reduce-scatter (n-1)/n). Returns
    a function restoring the kernels (a compiled graph must not see the counting code)."""
    saved = []

    def wrap(cls, factor):
        orig = cls.construct
        saved.append((cls, orig))

        def construct(self, x):
            if self.n > 1:
                _COUNT["bytes"] += int(factor(self.n) * x.size * x.itemsize)
                _COUNT["calls"] += 1
            return orig(self, x)
        cls.construct = construct
    wrap(K.AllReduceKernel, lambda n: 2 * (n - 1) / n)
    wrap(K.AllGatherKernel, lambda n: n - 1)
    wrap(K.ReduceScatterKernel, lambda n: (n - 1) / n)

    def restore():
        for cls, orig in saved:
            cls.construct = orig
    return restore


def config(tp, sp=False, layers=4, hidden=256, heads=4, vocab=4096, seq=128):
    return TransformerConfig(num_layers=layers, hidden_size=hidden, ffn_hidden_size=4 * hidden,
                             num_attention_heads=heads, vocab_size=vocab, seq_length=seq,
                             tensor_model_parallel_size=tp, sequence_parallel=sp, activation="gelu")


def run(tp, sp=False, batch=8, steps=6, modes=("pynative", "jit")):
    rank = get_env().rank
    out = {}
    for mode in modes:
        ms.set_seed(0)
        cfg = config(tp, sp)
        model = GPTModel(cfg)
        ids = np.random.RandomState(0).randint(0, cfg.vocab_size, (batch, cfg.seq_length)).astype(np.int32)
        parallelize(model, cfg, ids, ids)
        params = model.trainable_params()
        opt, reducer = AdamW(params, 1e-3), GradientReducer(params)
        grad_fn = ms.value_and_grad(model, None, params)

        def step(x, y):
            loss, grads = grad_fn(x, y)
            opt(reducer(grads))
            return loss

        fn = ms.jit(step) if mode == "jit" else step
        x, y = Tensor(ids), Tensor(ids)
        fn(x, y).asnumpy()           # compile / warm up
        if mode == "pynative":
            restore = _instrument()
            _COUNT.update(bytes=0, calls=0)
            fn(x, y).asnumpy()
            restore()
            comm = dict(_COUNT)
        times = []
        for _ in range(steps):
            t0 = time.perf_counter()
            fn(x, y).asnumpy()
            times.append(time.perf_counter() - t0)
        out[mode] = {"step_s": float(np.median(times))}
        if mode == "pynative":
            out["comm_bytes"], out["comm_calls"] = comm["bytes"], comm["calls"]
            out["planned_bytes"] = sharding_plan_of(model).bytes_per_step
            out["param_bytes"] = sum(int(np.prod(p.shape)) * 4 for p in params)
            sharded = [p for p in params if layout_of(p).sharded_axes()]
            out["sharded_param_bytes"] = sum(int(np.prod(p.shape)) * 4 for p in sharded)
            out["sharded_global_bytes"] = sum(int(np.prod(global_shape_of(p))) * 4 for p in sharded)
            out["rank"] = rank
    return out
