"""The data-parallel gradient all-reduce of bench/trainer.py's Llama alone, on 2 msrun CPU workers, under jit:
what dp2 pays per step on top of one process (docs/pipeline.md "Measured"). One all-reduce per gradient
(39 tensors, 4.72M floats: bench/trainer.py's plain_model), inside one compiled graph, launched in the
calling thread (compile_blocking) and by MindSpore (ms.jit). Prints the median per call (slowest rank)
and writes JSON.

    python bench/grad_allreduce.py [--repeats 3] [--steps 8]
"""
import argparse
import json
import os
import statistics
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from mindformers_core.testing import run_msrun  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "grad_allreduce.json"))
    args = parser.parse_args()
    runs = []
    for repeat in range(args.repeats):
        per_rank = run_msrun("bench.grad_allreduce_body:run", 2, kwargs={"steps": args.steps}, timeout=600)
        row = {"repeat": repeat, "floats": per_rank[0]["floats"], "tensors": per_rank[0]["tensors"]}
        for launch in ("blocking", "jit"):
            slowest = [max(r[launch][i] for r in per_rank) for i in range(args.steps)]
            row[launch] = {"median_s": statistics.median(slowest[1:]), "times": slowest}
        runs.append(row)
        print(f"run {repeat + 1}: {row['tensors']} tensors, {row['floats']:,} floats; median per call "
              f"blocking {row['blocking']['median_s'] * 1e3:.1f} ms, ms.jit {row['jit']['median_s'] * 1e3:.1f} ms",
              flush=True)
    for launch in ("blocking", "jit"):
        meds = [r[launch]["median_s"] for r in runs]
        print(f"{launch}: median of {len(meds)} runs {statistics.median(meds) * 1e3:.1f} ms "
              f"[{min(meds) * 1e3:.1f}-{max(meds) * 1e3:.1f}]")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(runs, f, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
