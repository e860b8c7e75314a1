"""The data-parallel gradient all-reduce of bench/trainer.py's Llama alone, on 2 msrun CPU workers, under jit:
what dp2 pays per step on top of one process (docs/pipeline.md "Measured").

* ``per tensor``: one all-reduce per gradient (39 tensors, 4.72M floats: bench/trainer.py's plain_model) inside
  one compiled graph, launched in the calling thread (compile_blocking) and by MindSpore (ms.jit);
* ``packed``: the same gradients concatenated, all-reduced in one call and split back, blocking launch;
* ``primitives``: the same payload as one flat tensor through each CPU collective MindSpore has (all-reduce,
  all-gather + local sum, broadcast from rank 0: one direction only);
* ``overlap``: a 5 x 1000 x 1000 tanh MLP (5.0M floats) on 2 workers, its loss and gradients alone, the
  all-reduce alone, both in one graph (the trainer's dp step), and the all-reduces issued from the backward
  layer by layer (a DDP-style gradient hook), the four interleaved round by round.

Medians per call over the steps after the first, slowest rank; repeated ``--repeats`` times; JSON written.

    python bench/grad_allreduce.py [--repeats 3] [--steps 8] [--rounds 10]
"""
import argparse
import json
import os
import statistics
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from mindformers_core.testing import run_msrun  # noqa: E402


def slowest_median(per_rank, get):
    """Median over calls 2.. of the slowest rank's time per call."""
    times = [max(get(r)[i] for r in per_rank) for i in range(len(get(per_rank[0])))]
    return statistics.median(times[1:]), times


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "grad_allreduce.json"))
    args = parser.parse_args()
    from bench.grad_allreduce_body import OVERLAP_MODES
    runs = []
    for repeat in range(args.repeats):
        per_rank = run_msrun("bench.grad_allreduce_body:run", 2, kwargs={"steps": args.steps, "rounds": args.rounds},
                             timeout=900)
        row = {"repeat": repeat, "floats": per_rank[0]["floats"], "tensors": per_rank[0]["tensors"]}
        for launch in ("blocking", "jit", "flat"):
            row[launch] = dict(zip(("median_s", "times"), slowest_median(per_rank, lambda r: r[launch])))
        for kind, get in (("primitives", lambda r, k: r["primitives"][k]),
                          ("overlap", lambda r, k: r["overlap"]["times"][k])):
            names = OVERLAP_MODES if kind == "overlap" else per_rank[0]["primitives"]
            row[kind] = {k: dict(zip(("median_s", "times"), slowest_median(per_rank, lambda r: get(r, k))))
                         for k in names}
        row["overlap_check"] = [r["overlap"]["first_gradient_sum"] for r in per_rank]
        runs.append(row)
        ms_ = {k: v["median_s"] * 1e3 for k, v in row["overlap"].items()}
        print(f"run {repeat + 1}: {row['tensors']} tensors, {row['floats']:,} floats; per tensor: blocking "
              f"{row['blocking']['median_s'] * 1e3:.1f} ms, ms.jit {row['jit']['median_s'] * 1e3:.1f} ms; packed "
              f"(concat, all-reduce, split) {row['flat']['median_s'] * 1e3:.1f} ms; flat: "
              + ", ".join(f"{k} {v['median_s'] * 1e3:.1f} ms" for k, v in row["primitives"].items())
              + "; overlap: " + ", ".join(f"{k} {v:.0f} ms" for k, v in ms_.items())
              + f" (compute + reduce_only = {ms_['compute'] + ms_['reduce_only']:.0f})", flush=True)
    print(f"\nmedian of {len(runs)} runs [min-max], ms per call (slowest of 2 ranks)")
    print(f"{'what':<34}{'median':>9}{'range':>17}")
    lines = [("per tensor, blocking launch", lambda r: r["blocking"]["median_s"]),
             ("per tensor, ms.jit launch", lambda r: r["jit"]["median_s"]),
             ("packed: concat, all-reduce, split", lambda r: r["flat"]["median_s"])]
    lines += [(f"flat {k}", (lambda k: lambda r: r["primitives"][k]["median_s"])(k)) for k in runs[0]["primitives"]]
    lines += [(f"overlap: {k}", (lambda k: lambda r: r["overlap"][k]["median_s"])(k)) for k in OVERLAP_MODES]
    for name, get in lines:
        vals = [get(r) * 1e3 for r in runs]
        print(f"{name:<34}{statistics.median(vals):>9.1f}{f'[{min(vals):.1f}-{max(vals):.1f}]':>17}")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(runs, f, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
