"""Generation speed with the static KV cache (mindformers_core/generation) on one process, the design's
reference Llama (hidden 256, 4 layers, 4 heads, FFN 1024, vocab 4096), random weights, batch 1.

Reports, per mode (jit by default):
- prefill and decode tokens/s generating 128 tokens from a 64-token prompt (cache of 192 slots), against
  the old full-recompute path (every new token re-runs the whole model over a fixed 192-token window; the
  same graph compiled once) on the same prompt: seconds and the ratio;
- decode time per token by position: an 8-token prompt and 248 new tokens (cache of 256 slots), the
  median step time over positions 8-23 and 232-247 and their ratio (a static cache: flat).
Medians of ``--repeats`` interleaved repeats (min-max). Prints a table and writes bench/results/generate.json.

    python bench/generate.py [--modes jit pynative] [--repeats 3]
"""
import argparse
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402
import mindspore as ms  # noqa: E402
from mindspore import Tensor  # noqa: E402

from mindformers_core.generation import GenerationConfig, Generator  # noqa: E402
from mindformers_core.models.llama import LlamaConfig, LlamaForCausalLM  # noqa: E402

PROMPT, NEW, WINDOW = 64, 128, 192


def build_model(seq_length):
    ms.set_seed(0)
    cfg = LlamaConfig.from_model_config(dict(num_layers=4, hidden_size=256, ffn_hidden_size=1024, num_heads=4,
                                             seq_length=seq_length, vocab_size=4096))
    return LlamaForCausalLM(cfg)


def old_path(model, ids, new, jit):
    """The previous run_mode predict: the whole model over a fixed window for every new token."""
    def forward(x):
        return model(x)
    fn = ms.jit(forward) if jit else forward
    ids = list(ids)
    out = []
    start = time.perf_counter()
    for _ in range(new):
        x = np.zeros((1, WINDOW), np.int32)
        x[0, :len(ids)] = ids
        logits = fn(Tensor(x)).asnumpy()
        nxt = int(logits[0, len(ids) - 1].argmax())
        ids.append(nxt)
        out.append(nxt)
    return out, time.perf_counter() - start


def cached(model, ids, new, jit, gen=None):
    gen = gen or Generator(model, GenerationConfig(max_new_tokens=new, eos_token_id=[]), jit=jit)
    start = time.perf_counter()
    results, stats = gen.generate([list(ids)])
    return results[0].new_ids, time.perf_counter() - start, stats, gen


def summary(values):
    values = sorted(values)
    return {"median": float(np.median(values)), "min": float(values[0]), "max": float(values[-1])}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--modes", nargs="+", default=["jit"], choices=["jit", "pynative"])
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    prompt = rng.integers(3, 4096, PROMPT).tolist()
    short = prompt[:8]
    report = {}
    for mode in a.modes:
        jit = mode == "jit"
        model = build_model(WINDOW)
        # warm-up: compile each graph once (not timed)
        ref, _ = old_path(model, prompt, 2, jit)
        _, _, _, gen = cached(model, prompt, NEW, jit)
        _, _, _, gen_long = cached(model, short, 248, jit)
        rows = {"old_s": [], "cached_s": [], "prefill_tps": [], "decode_tps": [], "pos16_ms": [], "pos240_ms": []}
        same = None
        for _ in range(a.repeats):
            old_ids, old_s = old_path(model, prompt, NEW, jit)
            new_ids, new_s, stats, _ = cached(model, prompt, NEW, jit, gen)
            same = old_ids == new_ids if same is None else same and old_ids == new_ids
            rows["old_s"].append(old_s)
            rows["cached_s"].append(new_s)
            rows["prefill_tps"].append(stats.prefill_tokens_per_s)
            rows["decode_tps"].append(stats.decode_tokens_per_s)
            _, _, long_stats, _ = cached(model, short, 248, jit, gen_long)
            steps = np.array(long_stats.step_seconds) * 1e3       # step t writes position 8 + t
            rows["pos16_ms"].append(float(np.median(steps[0:16])))
            rows["pos240_ms"].append(float(np.median(steps[240 - 8 - 8:240 - 8 + 8])))
        res = {k: summary(v) for k, v in rows.items()}
        res["speedup"] = res["old_s"]["median"] / res["cached_s"]["median"]
        res["speedup_per_repeat"] = summary([o / c for o, c in zip(rows["old_s"], rows["cached_s"])])
        res["pos240_over_pos16"] = res["pos240_ms"]["median"] / res["pos16_ms"]["median"]
        res["pos_ratio_per_repeat"] = summary([b / a for a, b in zip(rows["pos16_ms"], rows["pos240_ms"])])
        res["same_greedy_ids_as_old_path"] = bool(same)
        report[mode] = res
        print(f"\n{mode}: 128 new tokens from a 64-token prompt (batch 1), medians of {a.repeats} (min-max)")
        fmt = lambda s, unit="": f"{s['median']:.3f}{unit} ({s['min']:.3f}-{s['max']:.3f})"  # noqa: E731
        print(f"  old full-recompute path   {fmt(res['old_s'], ' s')}")
        print(f"  KV cache                  {fmt(res['cached_s'], ' s')}   speedup {res['speedup']:.1f}x, "
              f"same greedy ids: {same}")
        print(f"  speedup within a repeat   {fmt(res['speedup_per_repeat'], 'x')}")
        print(f"  prefill tokens/s          {fmt(res['prefill_tps'])}")
        print(f"  decode tokens/s           {fmt(res['decode_tps'])}")
        print(f"  decode step at pos 16     {fmt(res['pos16_ms'], ' ms')}")
        print(f"  decode step at pos 240    {fmt(res['pos240_ms'], ' ms')}   ratio {res['pos240_over_pos16']:.2f}")
        print(f"  pos 240 / pos 16 per repeat {fmt(res['pos_ratio_per_repeat'])}")
    os.makedirs(os.path.join(ROOT, "bench", "results"), exist_ok=True)
    with open(os.path.join(ROOT, "bench", "results", "generate.json"), "w") as f:
        json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
