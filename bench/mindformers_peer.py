"""MindFormers 2.1.0's own legacy Llama as a peer row of bench/trainer.py (``--peer mindformers``).

Runs under ANOTHER interpreter than the project's (the throwaway venv of scripts/make_mindformers_fixtures.py, where
``import mindformers`` works; never a dependency of mindformers_core or its tests), so it imports nothing from the
project: bench/trainer.py passes the sizes on the command line and reads one line ``MF_RESULT {json}`` from stdout.

The row: MindFormers' legacy ``LlamaForCausalLM`` (``use_legacy``, ``use_rope_slice``, no flash attention, no
fused RMSNorm, float32, CPU, graph mode) with the trainer rows' sizes, its own loss (next-token cross-entropy over
``seq + 1`` ids), its ``ClipGradNorm(max_norm=1.0)`` and its ``AdamW`` (lr 1e-3, betas 0.9/0.95, eps 1e-8, weight
decay 0.01: the trainer's defaults), one step = ``value_and_grad`` + clip + update under one ``ms.jit`` on one
process. MindFormers' own ``Trainer`` / ``MFTrainOneStepCell`` stop on CPU (NPUGetFloatStatusV2), so its building
blocks are driven here. The ids are seeded random (not the trainer rows' corpus): no loss parity column.

    /work/mfvenv/bin/python bench/mindformers_peer.py --steps 10 --warmup 2 --hidden 256 --layers 4 --heads 4 \\
        --ffn 1024 --seq 128 --vocab 1024 --batch 8 --threads 2
"""
import argparse
import json
import os
import resource
import time

import numpy as np


def main():
    ap = argparse.ArgumentParser()
    for key, default in (("steps", 10), ("warmup", 2), ("hidden", 256), ("layers", 4), ("heads", 4), ("ffn", 1024),
                         ("seq", 128), ("vocab", 1024), ("batch", 8), ("threads", 0)):        # threads: recorded only (MindSpore's default)
        ap.add_argument(f"--{key}", type=int, default=default)
    a = ap.parse_args()
    os.environ.setdefault("LOCAL_DEFAULT_PATH", "/tmp/mfout")
    import mindspore as ms
    import mindformers
    from mindformers import build_context
    from mindformers.core.clip_grad import ClipGradNorm
    from mindformers.core.optim.adamw import AdamW
    from mindformers.models.llama import LlamaConfig, LlamaForCausalLM
    context = {"mode": "GRAPH_MODE", "device_target": "CPU"}
    build_context({"use_legacy": True, "context": context, "parallel": {}})
    ms.set_seed(0)
    cfg = LlamaConfig(batch_size=a.batch, seq_length=a.seq, hidden_size=a.hidden, num_layers=a.layers,
                      num_heads=a.heads, n_kv_heads=a.heads, intermediate_size=a.ffn, vocab_size=a.vocab,
                      use_past=False, use_flash_attention=False, use_rope_slice=True, fused_rms_norm=False,
                      compute_dtype="float32", layernorm_compute_type="float32", softmax_compute_type="float32",
                      rotary_dtype="float32", param_init_type="float32", rms_norm_eps=1e-5, theta=10000.0)
    model = LlamaForCausalLM(cfg)
    model.set_train(True)
    params = model.trainable_params()
    opt = AdamW(params, learning_rate=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.01)
    clip = ClipGradNorm(max_norm=1.0)
    grad = ms.value_and_grad(model, None, opt.parameters)

    @ms.jit
    def step(ids):
        loss, grads = grad(ids)
        grads, _ = clip(grads)
        opt(grads)
        return loss

    rng = np.random.default_rng(0)
    data = [ms.Tensor(rng.integers(0, a.vocab, (a.batch, a.seq + 1)).astype(np.int32)) for _ in range(a.steps)]
    times, losses, usage, wall0 = [], [], None, 0.0
    for i, ids in enumerate(data):
        if i == a.warmup:
            usage, wall0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        t0 = time.perf_counter()
        loss = float(step(ids).asnumpy())
        times.append(time.perf_counter() - t0)
        losses.append(loss)
    after, wall = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter() - wall0
    cpu = (after.ru_utime - usage.ru_utime) + (after.ru_stime - usage.ru_stime)
    with open("/proc/self/status") as f:
        hwm = next((int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM")), 0)
    out = {"config": "1proc", "mindformers": mindformers.__version__, "mindspore": ms.__version__,
           "threads": a.threads, "step_times": times, "losses": losses, "cpu_s": {"0": cpu}, "wall_s": {"0": wall},
           "rss": {"0": hwm}}
    print("MF_RESULT " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
