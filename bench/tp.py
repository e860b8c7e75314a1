"""Tensor parallel on msrun CPU ranks: the reference GPT (hidden 256, 4 layers, 4 heads, GELU MLP
4x, vocab 4096, batch 8 x seq 128) parallelized by its layers' shard() declarations at tp 1/2/4.

Reports per tp: step time (PyNative and jit) and its ratio to tp=1, per-rank parameter bytes
(sharded weights should be 1/tp of their global size), and communication bytes per rank per
step measured by counting every collective issued in one PyNative step, against the analytic
Megatron count: per layer 2 all-reduces of B*S*H forward and 2 backward (without SP) or the same
number of all-gather + reduce-scatter pairs (with SP), plus the vocab-parallel embedding's
all-reduce (forward) and the cross-entropy's three (B*S each), and the gradient all-reduces of
weights replicated over tp under SP (norm weights). Prints a table and writes bench/results/tp.json.

    python bench/tp.py [--tp 1 2 4] [--sp]
"""
import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from mindformers_core.testing import run_msrun  # noqa: E402

B, S, H, LAYERS, V = 8, 128, 256, 4, 4096


def analytic(tp, sp):
    if tp == 1:
        return 0
    act = B * S * H * 4
    ring_ar = 2 * (tp - 1) / tp
    if sp:
        pair = (tp - 1) / tp * act * 2          # all-gather + reduce-scatter of a full activation
        per_layer = 2 * 2 * pair                # 2 sites, forward + backward
        embed = (tp - 1) / tp * act * 2         # reduce-scatter out of the embedding (+ its backward)
        final = (tp - 1) / tp * act * 2         # all-gather before the output layer (+ backward)
        norms = (2 * LAYERS + 1) * H * 4 * ring_ar
        extra = embed + final + norms
    else:
        per_layer = 2 * 2 * ring_ar * act
        extra = ring_ar * act                   # embedding output all-reduce (backward identity)
        extra += ring_ar * act                  # f before the output layer: backward all-reduce
    ce = 3 * ring_ar * B * S * 4                # max, sum-exp, target logit (forward)
    return int(LAYERS * per_layer + extra + ce)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tp", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--sp", action="store_true")
    args = ap.parse_args()
    rows = []
    for tp in args.tp:
        res = run_msrun("bench.tp_body:run", tp, kwargs={"tp": tp, "sp": args.sp, "batch": B}, timeout=1800)
        r0 = res[0]
        rows.append({"tp": tp, "pynative_s": r0["pynative"]["step_s"], "jit_s": r0["jit"]["step_s"],
                     "param_bytes": r0["param_bytes"], "sharded_param_bytes": r0["sharded_param_bytes"],
                     "sharded_global_bytes": r0["sharded_global_bytes"],
                     "comm_bytes": r0["comm_bytes"], "comm_calls": r0["comm_calls"],
                     "planned_bytes": r0["planned_bytes"], "analytic_bytes": analytic(tp, args.sp)})
    base = {m: next((r[m] for r in rows if r["tp"] == 1), None) for m in ("pynative_s", "jit_s")}
    print(f"tensor parallel, reference GPT B={B} S={S} H={H} L={LAYERS} V={V}, sp={args.sp}")
    print(f"{'tp':>3} {'pyn s':>7} {'x tp1':>6} {'jit s':>7} {'x tp1':>6} {'param MB':>9} {'shard frac':>10} "
          f"{'comm MB':>8} {'analytic MB':>11} {'calls':>6}")
    for r in rows:
        fr = r["sharded_param_bytes"] / r["sharded_global_bytes"] if r["sharded_global_bytes"] else 1.0
        rp = r["pynative_s"] / base["pynative_s"] if base["pynative_s"] else float("nan")
        rj = r["jit_s"] / base["jit_s"] if base["jit_s"] else float("nan")
        print(f"{r['tp']:>3} {r['pynative_s']:>7.3f} {rp:>6.2f} {r['jit_s']:>7.3f} {rj:>6.2f} "
              f"{r['param_bytes'] / 1e6:>9.2f} {fr:>10.3f} {r['comm_bytes'] / 1e6:>8.2f} "
              f"{r['analytic_bytes'] / 1e6:>11.2f} {r['comm_calls']:>6}")
    os.makedirs(os.path.join(ROOT, "bench", "results"), exist_ok=True)
    with open(os.path.join(ROOT, "bench", "results", "tp.json"), "w") as f:
        json.dump({"sp": args.sp, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
