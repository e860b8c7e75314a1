"""Worker side of bench/cp.py: the reference GPT with its sequence split over cp ranks (ring or
Ulysses), PyNative; times training steps and the attention kernel alone, counts the ring / all-to-all
payload bytes per rank, and reads the peak resident memory."""
import resource
import time

import numpy as np
import mindspore as ms
from mindspore import Tensor, nn, ops

from mindformers_core.common.sequence_placement import to_storage_order
from mindformers_core.distributed import get_env
from mindformers_core.sharding import context_parallel as C
from mindformers_core.sharding.annotations import sharding_plan_of
from mindformers_core.sharding.parallelizer import GradientReducer, parallelize
from mindformers_core.transformer import GPTModel, TransformerConfig

H, LAYERS, HEADS, FFN, V = 256, 4, 4, 1024, 4096
_COUNT = {"bytes": 0, "calls": 0}


def _instrument():
    """Count, in PyNative, the payload each rank sends: a ring hop sends its block once; Ulysses'
    all-to-all sends (n-1)/n of its input. Returns a function restoring the kernels."""
    saved = []

    def wrap(cls, factor):
        orig = cls.construct
        saved.append((cls, orig))

        def construct(self, x, *rest):
            n = getattr(self, "n", 1)
            if n > 1:
                _COUNT["bytes"] += int(factor(n) * x.size * x.itemsize)
                _COUNT["calls"] += 1
            return orig(self, x, *rest)
        cls.construct = construct
    for module in (C, C._backward_twin()):     # the backward's kernels come from the twin module
        wrap(module.RingShift, lambda n: 1)
        wrap(module._AllToAll, lambda n: (n - 1) / n)

    def restore():
        for cls, orig in saved:
            cls.construct = orig
    return restore


def config(seq, cp, algo, balance=True):
    return TransformerConfig(num_layers=LAYERS, hidden_size=H, ffn_hidden_size=FFN, num_attention_heads=HEADS,
                             vocab_size=V, seq_length=seq, activation="gelu", context_parallel_size=cp,
                             context_parallel_algo=algo, context_parallel_load_balance=balance)


def _sync(x):
    for t in x if isinstance(x, (tuple, list)) else (x,):
        t.asnumpy()


def train_time(seq, cp, algo, batch, steps):
    rank = get_env().rank
    ms.set_seed(0)
    cfg = config(seq, cp, algo)
    model = GPTModel(cfg)
    tokens = np.random.RandomState(0).randint(0, V, (batch, seq + 1)).astype(np.int32)
    ids, labels = tokens[:, :-1], tokens[:, 1:]
    parallelize(model, cfg, ids, labels)
    cut = sharding_plan_of(model).input_layouts[0].local_slice(ids.shape, rank)
    pos = cfg.token_positions()
    ids, labels = (Tensor(to_storage_order(a, pos)[cut]) for a in (ids, labels))
    params = model.trainable_params()
    opt = nn.Momentum(params, learning_rate=0.01, momentum=0.9)
    reducer = GradientReducer(params)
    grad_fn = ms.value_and_grad(model, None, params)
    restore = _instrument()
    _COUNT.update(bytes=0, calls=0)
    loss, grads = grad_fn(ids, labels)
    opt(reducer(grads))
    _sync(loss)
    restore()
    comm = dict(_COUNT)
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        loss, grads = grad_fn(ids, labels)
        opt(reducer(grads))
        _sync(grads)
        times.append(time.perf_counter() - t)
    return {"step_s": float(np.median(times)), "loss": float(loss), "comm_bytes": comm["bytes"],
            "comm_calls": comm["calls"]}


def attention_time(seq, cp, balance, batch, reps):
    """The ring kernel alone (forward + backward) on this rank's q/k/v, timed per rank."""
    from mindformers_core.distributed.process_group import new_group
    env = get_env()
    ring = new_group(list(range(env.world_size)))
    d = H // HEADS
    s = seq // cp
    rng = np.random.RandomState(env.rank)
    q, k, v = (Tensor(rng.randn(batch, HEADS, s, d).astype(np.float32)) for _ in range(3))
    core = C.RingAttentionCore(ring, q.shape, k.shape, 1.0 / np.sqrt(d), balance)
    fn = ms.value_and_grad(lambda a, b, c: core(a, b, c)[..., :d].sum(), (0, 1, 2))
    _sync(fn(q, k, v)[1])
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        _sync(fn(q, k, v)[1])
        times.append(time.perf_counter() - t)
    return float(np.median(times))


def run(cases, batch=1, steps=2, reps=3):
    """``cases``: list of (seq, algo); ring cases also time the attention kernel with and without zigzag."""
    cp = get_env().world_size
    out = {}
    for seq, algo in cases:
        r = train_time(seq, cp, algo, batch, steps)
        if algo == "colossal" and cp > 1:
            r["attn_zigzag_s"] = attention_time(seq, cp, True, batch, reps)
            r["attn_contiguous_s"] = attention_time(seq, cp, False, batch, reps)
        r["peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        out[f"{seq}/{algo}"] = r
    return out
