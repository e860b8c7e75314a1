"""Where the PyNative step of one process goes: our parallelized Llama + step wrapper against the
plain-MindSpore Llama of bench/trainer.py (same sizes: hidden 256, 4 layers, 4 heads, FFN 1024,
seq 128, vocab 1024, batch 8, fp32), in one process, the parts timed in turn (interleaved, so a slow
phase of the shared machine spreads over all of them):

* ``forward``: ``model(ids, labels)`` (the loss), read back;
* ``fwd+bwd``: ``value_and_grad`` of the model over its parameters, every gradient read back;
* ``clip`` / ``reduce`` / ``update``: our step wrapper's parts on those gradients (gradient reducer,
  global-norm clipping, the host read of the norm, the fused AdamW with its lr schedule), plain
  MindSpore's ``nn.AdamWeightDecay``;
* ``step``: the whole step as the trainer runs it (``training.steps`` eager step) and as the plain
  row runs it.

It also counts the eager kernels launched per part (PyNative's ``ms.runtime`` op launches, read from
MindSpore's profiler when ``--ops`` is given). Prints a table and writes JSON (``--out``).

    python bench/eager_breakdown.py [--repeats 8] [--threads 2] [--out bench/results/eager_breakdown.json]
"""
import argparse
import json
import math
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))

from trainer import FFN, GLOBAL_BATCH, HEADS, HIDDEN, LAYERS, SEQ, VOCAB, plain_model  # noqa: E402


def ours():
    """Our Llama as the trainer builds it at dp = tp = pp = 1, and the trainer's eager step pieces."""
    import numpy as np
    import mindspore as ms
    from mindformers_core.models.llama import LlamaConfig, LlamaForCausalLM
    from mindformers_core.optim import AdamW, ClipGradNorm, StepGuard, build_lr_schedule
    from mindformers_core.sharding.layout import Layout
    from mindformers_core.sharding.parallelizer import GradientReducer, parallelize
    cfg = LlamaConfig.from_model_config(dict(num_layers=LAYERS, hidden_size=HIDDEN, ffn_hidden_size=FFN,
                                             num_heads=HEADS, n_kv_heads=HEADS, seq_length=SEQ, vocab_size=VOCAB,
                                             rms_norm_eps=1e-5, rope_theta=10000.0, hidden_act="silu",
                                             compute_dtype="float32", param_init_dtype="float32"))
    ms.set_seed(1234)
    model = LlamaForCausalLM(cfg)
    ids = np.zeros((GLOBAL_BATCH, SEQ), np.int32)
    parallelize(model, cfg, ids, ids, mesh=Layout((1, 1, 1), ("dp", "cp", "tp"), [0]), rank=0)
    params = model.trainable_params()
    lr = build_lr_schedule("CosineWithWarmUpLR", 1e-3, 0, 1000, 1e-5)
    opt = AdamW(params, lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.01)
    return model, params, opt, GradientReducer(params), ClipGradNorm(math.inf), StepGuard(True, None)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--only", nargs="*", default=None, help="time only these parts")
    parser.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "eager_breakdown.json"))
    args = parser.parse_args()
    import numpy as np
    import mindspore as ms
    from mindspore import Tensor
    ms.set_context(mode=ms.PYNATIVE_MODE, device_target="CPU")
    if args.threads:
        ms.device_context.cpu.op_tuning.threads_num(args.threads)

    model, params, opt, reducer, clip, guard = ours()
    ms.set_seed(0)
    pnet, popt = plain_model()
    grad_ours = ms.value_and_grad(model, None, params)
    grad_plain = ms.value_and_grad(pnet, None, popt.parameters)
    rng = np.random.default_rng(0)
    ids = Tensor(rng.integers(0, VOCAB, (GLOBAL_BATCH, SEQ)).astype(np.int32))
    labels = Tensor(rng.integers(0, VOCAB, (GLOBAL_BATCH, SEQ)).astype(np.int32))
    _, g_ours = grad_ours(ids, labels)
    _, g_plain = grad_plain(ids, labels)

    def sync(x):
        if isinstance(x, (tuple, list)):
            for y in x:
                sync(y)
        elif isinstance(x, Tensor):
            x.asnumpy()
        return x

    def ours_step():          # training.steps eager_step with k = 1, no pipeline, no hsdp
        loss, grads = grad_ours(ids, labels)
        grads, norm = clip(reducer(grads))
        if guard.is_ok(float(norm.asnumpy())):
            opt(grads)
        return float(loss.asnumpy()), norm

    def ours_wrapper():      # the same without the forward and backward
        grads, norm = clip(reducer(g_ours))
        if guard.is_ok(float(norm.asnumpy())):
            opt(grads)
        return norm

    def plain_step():
        loss, grads = grad_plain(ids, labels)
        popt(grads)
        return float(loss.asnumpy())

    parts = {
        "plain forward": lambda: sync(pnet(ids, labels)),
        "ours forward": lambda: sync(model(ids, labels)),
        "plain fwd+bwd": lambda: sync(grad_plain(ids, labels)),
        "ours fwd+bwd": lambda: sync(grad_ours(ids, labels)),
        "plain update (nn.AdamWeightDecay)": lambda: sync(popt(g_plain)),
        "ours reduce": lambda: sync(reducer(g_ours)),
        "ours clip (norm + scale)": lambda: sync(clip(g_ours)),
        "ours update (AdamW + lr)": lambda: sync(opt(g_ours)),
        "ours wrapper (reduce, clip, host read, update)": lambda: sync(ours_wrapper()),
        "plain step": plain_step,
        "ours step": ours_step,
    }
    if args.only:
        parts = {k: v for k, v in parts.items() if any(o in k for o in args.only)}
    times = {k: [] for k in parts}
    for i in range(args.warmup + args.repeats):
        for name, fn in parts.items():
            t0 = time.perf_counter()
            fn()
            if i >= args.warmup:
                times[name].append(time.perf_counter() - t0)
    rows = []
    print(f"{'part':<48} {'median ms':>10} {'min':>8} {'max':>8}")
    for name, ts in times.items():
        row = {"part": name, "median_ms": 1e3 * statistics.median(ts), "min_ms": 1e3 * min(ts),
               "max_ms": 1e3 * max(ts)}
        rows.append(row)
        print(f"{name:<48} {row['median_ms']:>10.1f} {row['min_ms']:>8.1f} {row['max_ms']:>8.1f}")
    load = os.getloadavg()
    print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"rows": rows, "repeats": args.repeats, "threads": args.threads, "load": load}, f, indent=1)


if __name__ == "__main__":
    main()
