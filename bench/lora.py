"""Why LoRA exists, measured: full fine-tuning vs LoRA on the reference Llama (hidden 256, 4 layers, 4 heads,
FFN 1024, seq 128, global batch 8, AdamW, fp32), one process, PyNative and jit.

Each (config, mode) runs ``run_mindformer``'s Trainer in its own process for ``--steps`` steps (the built-in
corpus and tokenizer, random base weights: the memory and time do not depend on the values) and reports:
trainable parameters, AdamW state bytes (two fp32 moments per trainable element, as held by the optimizer),
gradient bytes (one per trainable element), checkpoint bytes of the last step (what a save writes), the peak
resident memory of the process (``ru_maxrss``) and the median step time over the steps after the first.
Configs are run interleaved, ``--repeats`` times; medians with min-max.

    python bench/lora.py [--size ref|wide] [--modes pynative jit] [--repeats 3] [--steps 6]

``--size wide``: hidden 1024, FFN 4096, 8 heads, 4 layers, batch 1 (~54M parameters), where the weights and
their AdamW state, not the activations, fill the memory. Prints a table and writes bench/results/lora_<size>.json.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIZES = ["--model.model_config.num_layers", 4, "--model.model_config.hidden_size", 256,
         "--model.model_config.num_heads", 4, "--model.model_config.n_kv_heads", 4,
         "--model.model_config.ffn_hidden_size", 1024, "--model.model_config.seq_length", 128,
         "--runner_config.batch_size", 8]
LORA = {"pet_type": "lora", "lora_rank": 8, "lora_alpha": 16, "lora_dropout": 0.0,
        "target_modules": ".*q_proj|.*k_proj|.*v_proj|.*o_proj|.*gate_proj|.*up_proj|.*down_proj"}
# wide: weights dominate the memory (hidden 1024, FFN 4096, 4 layers, ~54M parameters; one row of 128 tokens)
WIDE = ["--model.model_config.hidden_size", 1024, "--model.model_config.num_heads", 8,
        "--model.model_config.n_kv_heads", 8, "--model.model_config.ffn_hidden_size", 4096,
        "--runner_config.batch_size", 1]
CONFIGS = {"full": [], "lora": ["--model.model_config.pet_config", json.dumps(LORA)]}


def child(config: str, mode: str, steps: int, out: str, size: str = "ref") -> dict:
    import resource
    sys.path.insert(0, ROOT)
    import run_mindformer
    from mindformers_core.training.trainer import Trainer
    argv = ["--config", os.path.join(ROOT, "configs", "llama_tiny.yaml"), "--output_dir", out,
            "--mode", 1 if mode == "pynative" else 0, "--runner_config.max_steps", steps,
            "--callbacks", "[{type: MFLossMonitor}, {type: CheckpointMonitor, save_checkpoint_steps: %d}]" % steps,
            *SIZES, *(WIDE if size == "wide" else []), *CONFIGS[config]]
    a, overrides = run_mindformer.parse([str(x) for x in argv])
    from mindformers_core.training.config import load_config
    trainer = Trainer(load_config(a.config, [f"{k}={v}" for k, v in overrides], worker_num=1))
    trainer.train()
    trainable = sum(int(p.size) for p in trainer.params)
    total = sum(int(p.size) for c in trainer.built.chunks for p in c.get_parameters())
    moments = sum(int(m.size) * m.itemsize for m in list(trainer.optimizer.moment1) + list(trainer.optimizer.moment2))
    ckpt = os.path.join(out, "checkpoint", f"step_{steps}")
    ckpt_bytes = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(ckpt) for f in fs)
    with open(os.path.join(out, "loss.jsonl")) as f:
        times = [json.loads(line)["step_time_s"] for line in f][1:]
    return {"trainable": trainable, "total": total, "optimizer_bytes": moments, "grad_bytes": trainable * 4,
            "checkpoint_bytes": ckpt_bytes, "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "step_s": statistics.median(times)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--modes", nargs="+", default=["pynative", "jit"])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--size", default="ref", choices=["ref", "wide"])
    ap.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        config, mode, out = a.child
        print("RESULT " + json.dumps(child(config, mode, a.steps, out, a.size)), flush=True)
        return 0
    results = {}
    for r in range(a.repeats):
        for mode in a.modes:
            for config in CONFIGS:
                with tempfile.TemporaryDirectory() as tmp:
                    p = subprocess.run([sys.executable, __file__, "--steps", str(a.steps), "--size", a.size,
                                        "--child", config, mode,
                                        os.path.join(tmp, "out")], capture_output=True, text=True, cwd=ROOT)
                line = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
                if p.returncode or not line:
                    print(p.stdout[-2000:], p.stderr[-3000:])
                    return 1
                results.setdefault(mode, {}).setdefault(config, []).append(json.loads(line[0][7:]))
    rows = {}
    print(f"{'mode':9s}{'config':6s}{'trainable':>12s}{'of total':>10s}{'AdamW MB':>10s}{'grads MB':>10s}"
          f"{'ckpt MB':>9s}{'peak RSS MB (min-max)':>24s}{'step s (min-max)':>22s}")
    for mode, configs in results.items():
        for config, runs in configs.items():
            first = runs[0]
            rss = [x["peak_rss_bytes"] / 1e6 for x in runs]
            step = [x["step_s"] for x in runs]
            rows[f"{mode}/{config}"] = dict(first, peak_rss_mb=rss, step_s=step)
            print(f"{mode:9s}{config:6s}{first['trainable']:>12,d}{100 * first['trainable'] / first['total']:>9.2f}%"
                  f"{first['optimizer_bytes'] / 1e6:>10.2f}{first['grad_bytes'] / 1e6:>10.2f}"
                  f"{first['checkpoint_bytes'] / 1e6:>9.2f}"
                  f"{statistics.median(rss):>10.0f} ({min(rss):.0f}-{max(rss):.0f})".ljust(0) +
                  f"{statistics.median(step):>12.3f} ({min(step):.3f}-{max(step):.3f})")
    os.makedirs(os.path.join(ROOT, "bench", "results"), exist_ok=True)
    with open(os.path.join(ROOT, "bench", "results", f"lora_{a.size}.json"), "w") as f:
        json.dump(rows, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
