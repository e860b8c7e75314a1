"""Generation speed with the static KV cache (mindformers_core/generation) on one process, the design's
reference Llama (hidden 256, 4 layers, 4 heads, FFN 1024, vocab 4096), random weights, batch 1.

Reports, per mode (jit by default):
- prefill and decode tokens/s generating 128 tokens from a 64-token prompt (cache of 192 slots), against
  the old full-recompute path (every new token re-runs the whole model over a fixed 192-token window; the
  same graph compiled once) on the same prompt: seconds and the ratio. "KV cache" is what ``Generator``
  does for greedy decoding (its decode steps in one graph, ``decode_loop``); "one step per token" is the
  same with ``decode_loop=False`` (a graph launch, the logits' copy and the host's argmax per token);
- decode time per token by position: an 8-token prompt and 248 new tokens (cache of 256 slots), the loop
  in chunks of 16 steps (``loop_chunk``, what a streamer gets), the time per token of the chunks covering
  positions 8-23 and 232-247 and their ratio (a static cache: flat).
Medians of ``--repeats`` interleaved repeats (min-max). Prints a table and writes bench/results/generate.json.

``--breakdown``: one decode step taken apart (jit, 64-token prompt, position 64 of 192 slots), per token, wall
and process CPU milliseconds (the kernels' threads count in CPU): making the step's four input Tensors, the
compiled step called with Tensors made once (graph launch + the kernels), the logits' copy to NumPy
(``asnumpy``), the host's argmax, the whole ``run_step`` + argmax of a one-step-per-token generate, and the
greedy loop's time per step (``_loop_fn``: no per-token launch, copy or host work).

    python bench/generate.py [--modes jit pynative] [--repeats 3] [--breakdown]
"""
import argparse
import json
import os
import resource
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402
import mindspore as ms  # noqa: E402
from mindspore import Tensor  # noqa: E402

from mindformers_core.generation import GenerationConfig, Generator  # noqa: E402
from mindformers_core.generation.cache import detach_kv_cache, reattach  # noqa: E402
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


def generator(model, new, jit, **kwargs):
    return Generator(model, GenerationConfig(max_new_tokens=new, eos_token_id=[]), jit=jit, **kwargs)


def cached(gen, ids):
    start = time.perf_counter()
    results, stats = gen.generate([list(ids)])
    return results[0].new_ids, time.perf_counter() - start, stats


def summary(values):
    values = sorted(values)
    return {"median": float(np.median(values)), "min": float(values[0]), "max": float(values[-1])}


def cpu_seconds():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def timed(fn, n):
    """(wall ms, CPU ms) per call of ``fn`` over ``n`` calls."""
    w, c = time.perf_counter(), cpu_seconds()
    for _ in range(n):
        fn()
    return (time.perf_counter() - w) / n * 1e3, (cpu_seconds() - c) / n * 1e3


def breakdown(model, prompt, repeats, calls=60):
    """The decode step's parts, per token (module docstring); medians over ``repeats`` interleaved rounds."""
    step_gen = generator(model, NEW, True, decode_loop=False)
    loop_gen = generator(model, NEW, True)
    step_gen.generate([prompt])                  # compiles the prefill and the decode step
    loop_gen.generate([prompt])                  # compiles the loop
    ids, pos = np.array([[5]], np.int32), np.array([[PROMPT]], np.int32)
    slots, valid = np.array([PROMPT], np.int32), np.ones((1, WINDOW), np.int32)
    made = [Tensor(ids), Tensor(pos), Tensor(slots), Tensor(valid)]
    parts = {}

    def add(name, value):
        parts.setdefault(name, []).append(value)

    for _ in range(repeats):
        reattach(step_gen.model, step_gen._caches)
        step_gen.model.set_train(False)
        fn = step_gen._fn("step")
        logits = fn(*made)
        add("make the 4 input Tensors", timed(lambda: [Tensor(ids), Tensor(pos), Tensor(slots), Tensor(valid)],
                                              calls))
        add("step call (launch + kernels)", timed(lambda: fn(*made), calls))
        add("logits asnumpy (1, 1, 4096)", timed(lambda: logits.asnumpy(), calls))
        host = logits.asnumpy()[:, -1, :]
        add("host argmax", timed(lambda: host.argmax(-1), calls))
        add("run_step + asnumpy + argmax", timed(
            lambda: step_gen.run_step("step", ids, pos, slots, valid).asnumpy()[:, -1, :].argmax(-1), calls))
        detach_kv_cache(step_gen.model)
        _, _, stats = cached(step_gen, prompt)
        add("one step per token: generate's step", (float(np.median(stats.step_seconds)) * 1e3, float("nan")))
        c = cpu_seconds()
        _, _, stats = cached(loop_gen, prompt)
        add("greedy loop: per step", (float(np.median(stats.step_seconds)) * 1e3,
                                       (cpu_seconds() - c) / max(stats.decode_steps, 1) * 1e3))
    print("\ndecode step taken apart (jit, batch 1, position 64 of 192 slots), ms per token, "
          f"median of {repeats} rounds: wall / process CPU")
    out = {}
    for name, values in parts.items():
        wall = float(np.median([v[0] for v in values]))
        cpu = float(np.median([v[1] for v in values]))
        out[name] = {"wall_ms": wall, "cpu_ms": cpu}
        print(f"  {name:38s} {wall:7.3f} / {cpu:7.3f}")
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--modes", nargs="+", default=["jit"], choices=["jit", "pynative"])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--breakdown", action="store_true", help="also take one jit decode step apart")
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    prompt = rng.integers(3, 4096, PROMPT).tolist()
    short = prompt[:8]
    report = {"load_before": os.getloadavg()}
    for mode in a.modes:
        jit = mode == "jit"
        model = build_model(WINDOW)
        # warm-up: compile each graph once (not timed)
        old_path(model, prompt, 2, jit)
        gen, gen_step = generator(model, NEW, jit), generator(model, NEW, jit, decode_loop=False)
        gen_long = generator(model, 248, jit, loop_chunk=16)
        for g, p in ((gen, prompt), (gen_step, prompt), (gen_long, short)):
            cached(g, p)
        rows = {"old_s": [], "cached_s": [], "step_s": [], "prefill_tps": [], "decode_tps": [],
                "step_decode_tps": [], "pos16_ms": [], "pos240_ms": []}
        same = True
        for _ in range(a.repeats):
            old_ids, old_s = old_path(model, prompt, NEW, jit)
            new_ids, new_s, stats = cached(gen, prompt)
            step_ids, step_s, step_stats = cached(gen_step, prompt)
            same = same and old_ids == new_ids == step_ids
            rows["old_s"].append(old_s)
            rows["cached_s"].append(new_s)
            rows["step_s"].append(step_s)
            rows["prefill_tps"].append(stats.prefill_tokens_per_s)
            rows["decode_tps"].append(stats.decode_tokens_per_s)
            rows["step_decode_tps"].append(step_stats.decode_tokens_per_s)
            _, _, long_stats = cached(gen_long, short)
            steps = np.array(long_stats.step_seconds) * 1e3       # step t writes position 8 + t; chunks of 16
            rows["pos16_ms"].append(float(np.median(steps[0:16])))
            rows["pos240_ms"].append(float(np.median(steps[224:240])))
        res = {k: summary(v) for k, v in rows.items()}
        res["speedup"] = res["old_s"]["median"] / res["cached_s"]["median"]
        res["speedup_per_repeat"] = summary([o / c for o, c in zip(rows["old_s"], rows["cached_s"])])
        res["step_speedup"] = res["old_s"]["median"] / res["step_s"]["median"]
        res["pos240_over_pos16"] = res["pos240_ms"]["median"] / res["pos16_ms"]["median"]
        res["pos_ratio_per_repeat"] = summary([b / a for a, b in zip(rows["pos16_ms"], rows["pos240_ms"])])
        res["same_greedy_ids_as_old_path"] = bool(same)
        report[mode] = res
        print(f"\n{mode}: 128 new tokens from a 64-token prompt (batch 1), medians of {a.repeats} (min-max)")
        fmt = lambda s, unit="": f"{s['median']:.3f}{unit} ({s['min']:.3f}-{s['max']:.3f})"  # noqa: E731
        print(f"  old full-recompute path   {fmt(res['old_s'], ' s')}")
        print(f"  KV cache (greedy loop)    {fmt(res['cached_s'], ' s')}   speedup {res['speedup']:.1f}x, "
              f"same greedy ids: {same}")
        print(f"  speedup within a repeat   {fmt(res['speedup_per_repeat'], 'x')}")
        print(f"  one step per token        {fmt(res['step_s'], ' s')}   speedup {res['step_speedup']:.1f}x")
        print(f"  prefill tokens/s          {fmt(res['prefill_tps'])}")
        print(f"  decode tokens/s           {fmt(res['decode_tps'])}   (one step per token: "
              f"{fmt(res['step_decode_tps'])})")
        print(f"  decode at pos 8-23        {fmt(res['pos16_ms'], ' ms')} per token")
        print(f"  decode at pos 232-247     {fmt(res['pos240_ms'], ' ms')} per token   "
              f"ratio {res['pos240_over_pos16']:.2f}")
        print(f"  pos 240 / pos 16 per repeat {fmt(res['pos_ratio_per_repeat'])}")
        if a.breakdown and jit:
            res["breakdown"] = breakdown(model, prompt, a.repeats)
    report["load_after"] = os.getloadavg()
    print(f"\nload average before {report['load_before'][0]:.2f}, after {report['load_after'][0]:.2f}")
    os.makedirs(os.path.join(ROOT, "bench", "results"), exist_ok=True)
    with open(os.path.join(ROOT, "bench", "results", "generate.json"), "w") as f:
        json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
