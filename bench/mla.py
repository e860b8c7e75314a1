"""Why multi-latent attention exists, measured: its KV-cache bytes per token against grouped-query attention's,
and what it costs in training step time against the dense Llama of the same hidden size.

1. **Cache bytes per token** (all layers), read from the cache tensors ``generation.cache.attach_kv_cache``
   allocates (``LatentKVCache`` for MLA: the normed kv latent and the one rotary key; ``KVCache`` for
   attention with key/value groups), divided by batch x slots. Two sizes: the timed models below, and one
   layer of DeepSeek-V3's own sizes (h 7168, 128 heads; MLA kv_lora_rank 512 + rope 64; GQA 8 groups and
   MHA 128 groups of 128-wide keys/values, the comparison DeepSeek-V2's paper makes) times its 61 layers.
   float32 here (CPU); bfloat16 halves every row alike.
2. **Training step time** (jit, one process, ``run_mindformer``'s Trainer on the test corpus as MindRecord
   rows):
   ``DeepseekV3ForCausalLM`` with dense MLPs (MLA only: no experts, no MTP) against ``LlamaForCausalLM``
   (GQA) of the same hidden size, layers, heads, FFN, sequence and batch. Each (model, repeat) runs in its own
   process, the models interleaved, ``--repeats`` times; per run the median of the steps after the first
   (compile), and every step's time is kept in the JSON. Medians with min-max over the repeats.

    python bench/mla.py [--repeats 3] [--steps 8]

Prints the tables and writes bench/results/mla.json. Time only on a quiet machine (see docs/deepseek_v3.md).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

# the timed models: hidden 256, 4 layers, 8 heads of 32, FFN 1024, seq 128, batch 4; MLA sized like
# DeepSeek-V3 relative to its head size (kv latent 4 heads wide, q latent 6, rope half of the nope part)
COMMON = {"num_layers": 4, "hidden_size": 256, "num_heads": 8, "ffn_hidden_size": 1024, "seq_length": 128,
          "vocab_size": 384}
MLA = {"kv_lora_rank": 128, "q_lora_rank": 192, "qk_nope_head_dim": 32, "qk_rope_head_dim": 16,
       "v_head_dim": 32}
GQA_GROUPS = 2
BATCH = 4
MODELS = {"mla": "DeepseekV3ForCausalLM", "llama_gqa": "LlamaForCausalLM"}


def cache_bytes_per_token(config, layers: int, batch: int = 2, slots: int = 16) -> dict:
    """Allocate one layer's cache for ``batch`` x ``slots`` and read its tensors' bytes."""
    from mindformers_core.transformer.kv_cache import KVCache, LatentKVCache
    if getattr(config, "multi_latent_attention", False):
        cache = LatentKVCache(config, batch, slots)
        tensors = [cache.latent_cache, cache.rope_cache]
    else:
        cache = KVCache(config, batch, slots, value_dim=config.head_dim)
        tensors = [cache.key_cache, cache.value_cache]
    per_layer = sum(int(t.size) * t.itemsize for t in tensors) / (batch * slots)
    return {"shapes": [list(t.shape) for t in tensors], "bytes_per_token_layer": per_layer,
            "bytes_per_token": per_layer * layers, "layers": layers}


def cache_table() -> dict:
    """Per-token cache bytes: the timed models (attached to the built models) and DeepSeek-V3's sizes."""
    from mindformers_core.generation.cache import attach_kv_cache
    from mindformers_core.models.deepseek_v3 import DeepseekV3Config, DeepseekV3ForCausalLM
    from mindformers_core.models.llama import LlamaConfig, LlamaForCausalLM
    from mindformers_core.transformer import TransformerConfig
    from mindformers_core.transformer.mla import MLATransformerConfig
    out = {}
    small = dict(COMMON, seq_length=16)
    for name, model in (("bench mla", DeepseekV3ForCausalLM(DeepseekV3Config.from_model_config(dict(small, **MLA)))),
                        ("bench gqa", LlamaForCausalLM(LlamaConfig.from_model_config(dict(small, n_kv_heads=GQA_GROUPS)))),
                        ("bench mha", LlamaForCausalLM(LlamaConfig.from_model_config(small)))):
        caches = attach_kv_cache(model, 2, 16)
        tensors = [p for c in caches for p in c.get_parameters()]
        total = sum(int(t.size) * t.itemsize for t in tensors)
        out[name] = {"bytes_per_token": total / (2 * 16), "layers": len(caches),
                     "shapes": sorted({str(list(t.shape)) for t in tensors})}
    big = dict(num_layers=1, hidden_size=7168, num_attention_heads=128, vocab_size=8, seq_length=16)
    layers = 61
    out["DeepSeek-V3 mla"] = cache_bytes_per_token(MLATransformerConfig(
        **big, kv_lora_rank=512, q_lora_rank=1536, qk_head_dim=128, qk_pos_emb_head_dim=64, v_head_dim=128), layers)
    out["DeepSeek-V3 gqa8"] = cache_bytes_per_token(TransformerConfig(**big, kv_channels=128, num_query_groups=8),
                                                    layers)
    out["DeepSeek-V3 mha"] = cache_bytes_per_token(TransformerConfig(**big, kv_channels=128, num_query_groups=128),
                                                   layers)
    return out


def mindrecord(root: str) -> str:
    """The test corpus as MindRecord rows of seq_length tokens (pre-tokenized: both models read the same rows)."""
    from tests.test_trainer import mindrecord_corpus
    data = mindrecord_corpus(root, COMMON["seq_length"])
    return data["dir"] + os.pathsep + data["tokenizer"]


def child(model: str, steps: int, out: str, data: str) -> dict:
    import run_mindformer
    from mindformers_core.training.config import load_config
    from mindformers_core.training.trainer import Trainer
    keys = dict(COMMON, **(dict(MLA, n_kv_heads=COMMON["num_heads"]) if model == "mla" else {"n_kv_heads": GQA_GROUPS}))
    argv = ["--config", os.path.join(ROOT, "configs", "llama_tiny.yaml"), "--output_dir", out, "--mode", 0,
            "--train_dataset.type", "mindrecord", "--train_dataset_dir", data.split(os.pathsep)[0],
            "--train_dataset.tokenizer_file", data.split(os.pathsep)[1],
            "--runner_config.max_steps", steps, "--runner_config.batch_size", BATCH, "--callbacks",
            "[{type: MFLossMonitor}]", "--model.arch.type", MODELS[model]]
    for k, v in keys.items():
        argv += [f"--model.model_config.{k}", v]
    a, overrides = run_mindformer.parse([str(x) for x in argv])
    trainer = Trainer(load_config(a.config, [f"{k}={v}" for k, v in overrides], worker_num=1))
    trainer.train()
    with open(os.path.join(out, "loss.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    params = sum(int(p.size) for p in trainer.params)
    return {"params": params, "step_times": [r["step_time_s"] for r in rows], "losses": [r["loss"] for r in rows]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--skip_time", action="store_true", help="the cache table only (no training runs)")
    ap.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        print("RESULT " + json.dumps(child(a.child[0], a.steps, a.child[1], a.child[2])), flush=True)
        return 0
    caches = cache_table()
    print("KV-cache bytes per token, all layers (float32; measured from the allocated cache tensors)")
    print(f"{'model':18s}{'layers':>7s}{'bytes/token':>14s}{'vs MLA':>9s}  tensors per layer")
    for group in ("bench", "DeepSeek-V3"):
        mla = caches[f"{group} mla"]["bytes_per_token"]
        for name, row in caches.items():
            if name.startswith(group):
                print(f"{name:18s}{row['layers']:>7d}{row['bytes_per_token']:>14,.0f}"
                      f"{row['bytes_per_token'] / mla:>8.1f}x  {row['shapes']}")
    result = {"cache": caches}
    if not a.skip_time:
        runs = {}
        data = mindrecord(tempfile.mkdtemp(prefix="mla_bench_"))
        for _ in range(a.repeats):
            for model in MODELS:
                with tempfile.TemporaryDirectory() as tmp:
                    p = subprocess.run([sys.executable, __file__, "--steps", str(a.steps), "--child", model,
                                        os.path.join(tmp, "out"), data], capture_output=True, text=True, cwd=ROOT)
                line = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
                if p.returncode or not line:
                    print(p.stdout[-2000:], p.stderr[-3000:])
                    return 1
                runs.setdefault(model, []).append(json.loads(line[0][7:]))
        print(f"\ntraining step, jit, one process, batch {BATCH} x seq {COMMON['seq_length']}, hidden "
              f"{COMMON['hidden_size']}, {COMMON['num_layers']} layers ({a.repeats} interleaved repeats; per run the "
              f"median of steps 2..{a.steps})")
        print(f"{'model':11s}{'params':>10s}{'step s median (min-max)':>28s}  per-step times of the first run")
        timing = {}
        for model, rs in runs.items():
            med = [statistics.median(r["step_times"][1:]) for r in rs]
            timing[model] = {"params": rs[0]["params"], "median_s": statistics.median(med), "min_s": min(med),
                             "max_s": max(med), "runs": rs}
            print(f"{model:11s}{rs[0]['params']:>10,d}{statistics.median(med):>14.4f} ({min(med):.4f}-{max(med):.4f})"
                  f"  {[round(t, 4) for t in rs[0]['step_times']]}")
        ratio = timing["mla"]["median_s"] / timing["llama_gqa"]["median_s"]
        print(f"MLA / Llama step time: {ratio:.2f}")
        result["step"] = dict(timing, ratio=ratio, batch=BATCH, sizes=COMMON, mla_sizes=MLA, gqa_groups=GQA_GROUPS)
    os.makedirs(os.path.join(ROOT, "bench", "results"), exist_ok=True)
    with open(os.path.join(ROOT, "bench", "results", "mla.json"), "w") as f:
        json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
