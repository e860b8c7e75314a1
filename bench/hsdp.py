"""hsdp on N msrun CPU ranks: per-rank bytes of parameters, gradients and optimizer states for
each ZeRO level and shard size against the ZeRO formulas, and step time against pure data
parallel (shard_size=1) in the same mode.

Bytes are measured from the tensors each rank holds between steps (parameters, AdamW moments)
and from the reduced gradients the optimizer receives; ``dev %`` is the largest deviation of
the three from the formula. The formula counts parameters hsdp keeps
unsharded (below ``--threshold`` KB) in full; ``ZeRO ideal`` applies it to every parameter.
``peak MB``: parameter bytes at the step's peak (level3: the shards plus the one unit gathered
at a time, measured by hsdp's unit hooks; the other levels hold the full parameters).
Prints a table and writes bench/results/hsdp.json.

    python bench/hsdp.py [--nproc 4] [--modes jit pynative] [--width 256] [--layers 4] [--batch 32]
"""
import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from mindformers_core.testing import run_msrun  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, default=4)
    parser.add_argument("--modes", nargs="+", default=["jit", "pynative"], choices=["pynative", "jit"])
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=32, help="rows per rank")
    parser.add_argument("--threshold", type=float, default=64, help="KB")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "hsdp.json"))
    args = parser.parse_args()
    sizes = [s for s in (1, 2, 4, 8) if s <= args.nproc and args.nproc % s == 0]
    configs = []
    for mode in args.modes:
        configs.append(["level1", 1, mode])   # pure data parallel: the baseline
        for s in sizes[1:]:
            for level in ("level1", "level2", "level3"):
                configs.append([level, s, mode])
    results = run_msrun("bench.hsdp_body:run", args.nproc, timeout=1800, kwargs={
        "configs": configs, "width": args.width, "layers": args.layers, "batch": args.batch,
        "threshold": args.threshold, "warmup": args.warmup, "steps": args.steps, "threads": args.threads})
    rows = []
    for i, cfg in enumerate(configs):
        per_rank = [r[i] for r in results]
        first = per_rank[0]
        assert all(r["measured"] == first["measured"] for r in per_rank), "ranks hold different bytes"
        row = dict(first)
        row["step_s"] = max(r["step_s"] for r in per_rank)
        rows.append(row)
    for row in rows:
        base = next(r for r in rows if r["mode"] == row["mode"] and r["shard_size"] == 1)
        row["vs_dp"] = row["step_s"] / base["step_s"]
        row["ratio"] = {k: row["measured"][k] / row["formula"][k] for k in row["measured"]}
    mb = 1 / 2 ** 20
    p = max(rows, key=lambda r: r["sharded_fraction"])
    print(f"{args.nproc} ranks, MLP width {args.width} x {args.layers} blocks, {p['param_count']:,} parameters "
          f"({p['param_count'] * 4 * mb:.2f} MB fp32), {args.batch} rows/rank, threshold {args.threshold} KB "
          f"({p['sharded_fraction'] * 100:.2f}% of bytes shardable)")
    head = (f"{'mode':<9}{'level':<7}{'S':>2} | {'params MB':>9}{'grads MB':>9}{'optim MB':>9} | "
            f"{'formula':>23} | {'dev %':>6} | {'ZeRO ideal':>23} | {'peak MB':>8} | {'ms/step':>8}{'vs dp':>7}{'colls':>6}")
    print(head)
    print("-" * len(head))
    for r in rows:
        m, f, z = r["measured"], r["formula"], r["formula_no_threshold"]
        worst = max(abs(v - 1) for v in r["ratio"].values()) * 100
        print(f"{r['mode']:<9}{r['level'] if r['shard_size'] > 1 else 'dp':<7}{r['shard_size']:>2} | "
              f"{m['params'] * mb:>9.3f}{m['grads'] * mb:>9.3f}{m['optimizer'] * mb:>9.3f} | "
              f"{f['params'] * mb:>7.3f}{f['grads'] * mb:>8.3f}{f['optimizer'] * mb:>8.3f} | "
              f"{worst:>6.2f} | "
              f"{z['params'] * mb:>7.3f}{z['grads'] * mb:>8.3f}{z['optimizer'] * mb:>8.3f} | "
              f"{r['peak_params'] * mb:>8.3f} | "
              f"{r['step_s'] * 1e3:>8.1f}{r['vs_dp']:>6.2f}x{r['collectives_per_step']:>6.1f}")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"args": vars(args), "rows": rows}, f, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
