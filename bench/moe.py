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
    MoE layers;
  * under ms.jit both paths on the same model: the graph-mode variable path (jit's default for dropless
    routing) and the padded one (``jit_variable = False``): step time after compile, the first call
    (compile + one step), and for the variable path the off-rank bytes its graph recorded in one step
    (forward rows, x 2 for the backward's mirrored exchanges) against the analytic count from the count
    matrices it recorded; the padded path's bytes are analytic (its shapes are static), as are both CPU
    emulation buffers (variable: 4 exchanges of P x N k rows per layer; padded: 4 of P x E C rows).

Prints two tables and writes bench/results/moe.json.

    python bench/moe.py [--ranks 1 2 4] [--steps 3] [--pynative_steps 1] [--cases dense moe] [--no_pynative]
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


def ranks_buffer(ep, local_tokens, itemsize=4):
    """Bytes the CPU emulation of the padded exchange all-reduces per rank and step: 4 exchanges per MoE layer,
    each P x the (E, C, h) buffer (C = the rank's tokens, dropless)."""
    return SIZES["layers"] * 4 * ep * SIZES["experts"] * local_tokens * SIZES["h"] * itemsize


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--pynative_steps", type=int, default=1, help="timed PyNative steps per all-to-all path")
    ap.add_argument("--cases", nargs="+", default=["dense", "moe"], choices=["dense", "moe"])
    ap.add_argument("--no_pynative", action="store_true", help="skip the counted PyNative steps (jit rows only)")
    args = ap.parse_args()
    rows = []
    for n in args.ranks:
        kwargs = dict(cases=args.cases, batch=BATCH, steps=args.steps, pynative_steps=args.pynative_steps,
                      pynative=not args.no_pynative, **SIZES)
        if n == 1:
            from bench.moe_body import run
            from mindformers_core.distributed import init_distributed
            init_distributed()
            res = [run(**kwargs)]
        else:
            res = run_msrun("bench.moe_body:run", n, kwargs=kwargs, timeout=3000)
        tokens = BATCH * SIZES["seq"]
        for kind in args.cases:
            per = [r[kind] for r in res]
            local = BATCH // n * SIZES["seq"]
            split = kind == "moe" and n > 1
            padded_analytic = SIZES["layers"] * all_to_all_bytes(SIZES["experts"], local, SIZES["h"], n) \
                if split else 0
            load = np.sum([p["load"] for p in per], axis=0).tolist() if kind == "moe" else []   # all ranks' tokens
            a2a = [p["a2a"] for p in per]

            def most(path, key):
                return max(a[path][key] for a in a2a) if split and a2a[0] else 0

            def jit_most(path, key):
                return max(p["jit"][path][key] for p in per) if split else 0
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
                         "counts_rank0": a2a[0]["variable"]["counts"] if split and a2a[0] else [],
                         # jit: graph-mode variable path (the default) vs the padded one on the same model
                         "jit_variable_s": jit_most("variable", "step_s"), "jit_padded_s": jit_most("padded", "step_s"),
                         "jit_variable_first_s": jit_most("variable", "first_call_s"),
                         "jit_padded_first_s": jit_most("padded", "first_call_s"),
                         "jit_variable_bytes": jit_most("variable", "counted"),
                         "jit_variable_analytic": jit_most("variable", "analytic"),
                         "jit_variable_emulated_buffer": jit_most("variable", "buffer"),
                         "jit_padded_analytic": padded_analytic,
                         "jit_padded_emulated_buffer": ranks_buffer(n, local) if split else 0,
                         "jit_counts_rank0": per[0]["jit"]["variable"]["counts"] if split else [],
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
    print("\njit, graph-mode variable path vs padded (same model; step s after compile, first call = compile + 1 step;"
          " bytes per rank and step, off-rank, 4 MoE layers)")
    print(f"{'ranks':>5} {'var s':>7} {'pad s':>7} {'var 1st':>8} {'pad 1st':>8} {'var B counted':>14} {'analytic':>11} "
          f"{'pad B analytic':>14} {'var emul. B':>12} {'pad emul. B':>12}")
    for r in rows:
        if r["model"] == "moe" and r["ranks"] > 1:
            print(f"{r['ranks']:>5} {r['jit_variable_s']:>7.3f} {r['jit_padded_s']:>7.3f} {r['jit_variable_first_s']:>8.2f} "
                  f"{r['jit_padded_first_s']:>8.2f} {r['jit_variable_bytes']:>14,} {r['jit_variable_analytic']:>11,} "
                  f"{r['jit_padded_analytic']:>14,} {r['jit_variable_emulated_buffer']:>12,} "
                  f"{r['jit_padded_emulated_buffer']:>12,}")
    os.makedirs(os.path.join(ROOT, "bench", "results"), exist_ok=True)
    with open(os.path.join(ROOT, "bench", "results", "moe.json"), "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
