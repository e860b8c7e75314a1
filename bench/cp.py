"""Context parallelism on msrun CPU ranks: the reference GPT (hidden 256, 4 layers, 4 heads, GELU FFN
1024, vocab 4096) with its sequence split over cp ranks, ring attention ("colossal") and Ulysses,
PyNative, batch 1 (one sample of 512 / 1024 / 2048 tokens: a batch of 8 at 2048 tokens does not fit a
2-core machine's patience).

Reports per (seq, cp, method):
  * step time and its ratio to cp=1 (all ranks share the same 2 cores: a ratio > 1 is expected here;
    on real devices each rank has its own);
  * per-rank attention activation bytes, analytic: the largest score block a rank materializes
    (ring: (s/cp)^2 per head, Ulysses: s^2 for heads/cp heads, cp=1: s^2 for all heads), and the
    peak resident memory of the rank process (ru_maxrss: cumulative over the cases a process ran);
  * communication payload bytes per rank in one step, counted at the kernels, against the analytic
    count: ring, per layer, cp-1 hops of K/V forward, cp-1 hops of (K, V, dK, dV) and one of (dK, dV)
    backward; Ulysses, per layer, all-to-all of q, k, v and the output forward and the same backward,
    (cp-1)/cp of each;
  * per-rank time of the ring kernel alone (forward + backward) with the zigzag placement and with
    contiguous chunks.

Prints a table and writes bench/results/cp.json.

    python bench/cp.py [--seq 512 1024 2048] [--cp 1 2 4]
"""
import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from mindformers_core.testing import run_msrun  # noqa: E402

H, LAYERS, HEADS = 256, 4, 4
B = 1


def analytic_comm(seq, cp, algo):
    if cp == 1:
        return 0
    d = H // HEADS
    block = B * HEADS * (seq // cp) * d * 4          # one of K or V on one rank
    if algo == "colossal":
        fwd = (cp - 1) * 2 * block
        bwd = (cp - 1) * 4 * block + 2 * block
        return LAYERS * (fwd + bwd)
    full = B * HEADS * (seq // cp) * d * 4           # q, k, v, out: same local size (no GQA here)
    return int(LAYERS * 2 * 4 * full * (cp - 1) / cp)


def score_bytes(seq, cp, algo):
    if cp == 1:
        return B * HEADS * seq * seq * 4
    if algo == "colossal":
        return B * HEADS * (seq // cp) * (seq // cp) * 4
    return B * (HEADS // cp) * seq * seq * 4


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seq", type=int, nargs="+", default=[512, 1024, 2048])
    ap.add_argument("--cp", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--steps", type=int, default=2)
    args = ap.parse_args()
    rows = []
    for cp in args.cp:
        algos = ["colossal"] if cp == 1 else ["colossal", "ulysses"]
        cases = [(s, a) for s in args.seq for a in algos]
        res = run_msrun("bench.cp_body:run", cp, kwargs={"cases": cases, "batch": B, "steps": args.steps},
                        timeout=3000)
        for seq, algo in cases:
            per = [r[f"{seq}/{algo}"] for r in res]
            row = {"seq": seq, "cp": cp, "method": algo if cp > 1 else "-",
                   "step_s": max(p["step_s"] for p in per), "loss": per[0]["loss"],
                   "comm_bytes": max(p["comm_bytes"] for p in per), "analytic_bytes": analytic_comm(seq, cp, algo),
                   "score_block_bytes": score_bytes(seq, cp, algo),
                   "peak_rss_bytes": max(p["peak_rss_bytes"] for p in per)}
            if "attn_zigzag_s" in per[0]:
                row["attn_zigzag_s"] = [p["attn_zigzag_s"] for p in per]
                row["attn_contiguous_s"] = [p["attn_contiguous_s"] for p in per]
            rows.append(row)
    base = {r["seq"]: r["step_s"] for r in rows if r["cp"] == 1}
    print(f"{'seq':>5} {'cp':>3} {'method':>9} {'step s':>8} {'x cp1':>6} {'loss':>8} {'comm B/rank':>12} "
          f"{'analytic':>12} {'score blk B':>12} {'peak RSS MB':>11}  attention s per rank (zigzag | contiguous)")
    for r in rows:
        ratio = r["step_s"] / base[r["seq"]] if r["seq"] in base else float("nan")
        attn = ""
        if "attn_zigzag_s" in r:
            attn = (" ".join(f"{t:.3f}" for t in r["attn_zigzag_s"]) + " | "
                    + " ".join(f"{t:.3f}" for t in r["attn_contiguous_s"]))
        print(f"{r['seq']:>5} {r['cp']:>3} {r['method']:>9} {r['step_s']:>8.3f} {ratio:>6.2f} {r['loss']:>8.4f} "
              f"{r['comm_bytes']:>12,} {r['analytic_bytes']:>12,} {r['score_block_bytes']:>12,} "
              f"{r['peak_rss_bytes'] / 2**20:>11.0f}  {attn}")
    os.makedirs(os.path.join(ROOT, "bench", "results"), exist_ok=True)
    with open(os.path.join(ROOT, "bench", "results", "cp.json"), "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
