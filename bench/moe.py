"""Mixture of experts on msrun CPU ranks: a GPT (hidden 256, 4 layers, 4 heads, vocab 4096, seq 128,
global batch 8, AdamW, ms.jit) whose MLPs are MoE layers (8 SwiGLU experts of width 256, top-2,
dropless) against its dense twin with the same active parameters per token (SwiGLU width 2 x 256),
on 1, 2 and 4 ranks (data parallel; the MoE model's experts over ep = all ranks).

Reports per (model, ranks):
  * step time and tokens/s of the global batch (all ranks share the same 2 cores: compare rows of one
    run; on real devices each rank has its own);
  * all-to-all payload bytes per rank in one PyNative step, counted at the kernels, for both paths on
    the same model: the variable-count exchange (PyNative's default for dropless routing) against the
    analytic count from that step's count matrices (per MoE layer: 2 x (this rank's off-rank routed rows
    + the off-rank rows it received) x h x 4 B), and the padded equal-chunk exchange (what jit runs)
    against 4 (P - 1) (E / P) C h x 4 B per MoE layer (C = the rank's tokens, dropless); beside them
    the buffers the CPU emulation moves (variable: P x the largest send total rows, all-gathered;
    padded: P x the (E, C, h) buffer, all-reduced), and one PyNative step's time on each path;
  * the experts' load over the timed steps: tokens per expert (first MoE layer), min / max over all
    MoE layers.

Prints a table and writes bench/results/moe.json.

    python bench/moe.py [--ranks 1 2 4] [--steps 3] [--pynative_steps 1]
"""
import argparse
import json

import numpy as np
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from mindformers_core.sharding.expert_parallel import all_to_all_bytes  # noqa: E402
from mindformers_core.testing import run_msrun  # noqa: E402

SIZES = dict(h=256, layers=4, heads=4, vocab=4096, seq=128, experts=8, topk=2, expert_ffn=256)
BATCH = 8


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--pynative_steps", type=int, default=1, help="timed PyNative steps per all-to-all path")
    args = ap.parse_args()
    rows = []
    for n in args.ranks:
        kwargs = dict(cases=["dense", "moe"], batch=BATCH, steps=args.steps, pynative_steps=args.pynative_steps,
                      **SIZES)
        if n == 1:
            from bench.moe_body import run
            from mindformers_core.distributed import init_distributed
            init_distributed()
            res = [run(**kwargs)]
        else:
            res = run_msrun("bench.moe_body:run", n, kwargs=kwargs, timeout=3000)
        tokens = BATCH * SIZES["seq"]
        for kind in ("dense", "moe"):
            per = [r[kind] for r in res]
            local = BATCH // n * SIZES["seq"]
            split = kind == "moe" and n > 1
            padded_analytic = SIZES["layers"] * all_to_all_bytes(SIZES["experts"], local, SIZES["h"], n) \
                if split else 0
            load = np.sum([p["load"] for p in per], axis=0).tolist() if kind == "moe" else []   # all ranks' tokens
            a2a = [p["a2a"] for p in per]

            def most(path, key):
                return max(a[path][key] for a in a2a) if split else 0
            rows.append({"model": kind, "ranks": n, "ep": n if kind == "moe" else 1,
                         "step_s": max(p["step_s"] for p in per),
                         "tokens_per_s": tokens / max(p["step_s"] for p in per), "loss": per[0]["loss"],
                         "params_per_rank": per[0]["params"],
                         "pynative_variable_s": most("variable", "pynative_step_s"),
                         "pynative_padded_s": most("padded", "pynative_step_s"),
                         "variable_bytes": most("variable", "variable"),
                         "variable_analytic": most("variable", "analytic"),
                         "variable_emulated_buffer": most("variable", "variable_buffer"),
                         "padded_bytes": most("padded", "padded"), "padded_analytic": padded_analytic,
                         "padded_emulated_buffer": most("padded", "padded_buffer"),
                         "counts_rank0": a2a[0]["variable"]["counts"] if split else [],
                         "load_layer0": load[0] if load else [],
                         "load_min": min(min(l) for l in load) if load else None,
                         "load_max": max(max(l) for l in load) if load else None})
    print(f"{'model':>6} {'ranks':>5} {'ep':>3} {'jit s':>7} {'tok/s':>7} {'params/rank':>11} "
          f"{'eager var s':>11} {'eager pad s':>11} {'var B/rank':>11} {'analytic':>11} {'pad B/rank':>11} "
          f"{'analytic':>11} {'var emul. B':>12} {'pad emul. B':>12}  expert load (layer 1; min..max)")
    for r in rows:
        load = "" if r["model"] == "dense" else \
            f"{[int(x) for x in r['load_layer0']]}  {r['load_min']:.0f}..{r['load_max']:.0f}"
        print(f"{r['model']:>6} {r['ranks']:>5} {r['ep']:>3} {r['step_s']:>7.3f} {r['tokens_per_s']:>7.0f} "
              f"{r['params_per_rank']:>11,} {r['pynative_variable_s']:>11.3f} {r['pynative_padded_s']:>11.3f} "
              f"{r['variable_bytes']:>11,} {r['variable_analytic']:>11,} {r['padded_bytes']:>11,} "
              f"{r['padded_analytic']:>11,} {r['variable_emulated_buffer']:>12,} {r['padded_emulated_buffer']:>12,}"
              f"  {load}")
    os.makedirs(os.path.join(ROOT, "bench", "results"), exist_ok=True)
    with open(os.path.join(ROOT, "bench", "results", "moe.json"), "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
