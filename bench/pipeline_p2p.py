"""Point-to-point on CPU (MindSpore 2.10 has no Send/Receive kernel there): the alternatives for
moving a tensor from rank 0 to rank 1, timed on msrun workers, with and without a host sync
(``asnumpy``) after each transfer.

* pair all-reduce: AllReduce-SUM in a two-rank group, the receiver contributing zeros (what
  ``distributed.comm.send/recv`` do on CPU);
* world all-reduce / broadcast / all-gather: the native world-group kernels (every rank takes
  part; with 2 workers the world is the pair).

Prints ms per transfer (rank 0's and rank 1's timings, the slower) and writes
bench/results/pipeline_p2p.json.

    python bench/pipeline_p2p.py [--ranks 2] [--sizes 4096 65536 1048576] [--repeats 20]
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
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--sizes", type=int, nargs="+", default=[4096, 65536, 1048576],
                        help="float32 elements per transfer")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "pipeline_p2p.json"))
    args = parser.parse_args()
    per_rank = run_msrun("bench.pipeline_p2p_body:run", args.ranks, timeout=900,
                         kwargs={"sizes": args.sizes, "repeats": args.repeats})
    table = {}
    for rows in per_rank:
        for r in rows:
            key = (r["way"], r["numel"], r["sync_each"])
            t = table.setdefault(key, {"way": r["way"], "numel": r["numel"], "bytes": r["bytes"],
                                       "sync_each": r["sync_each"], "ms": 0.0, "correct": True})
            if r["involved"]:
                t["ms"] = max(t["ms"], r["seconds"] * 1e3)
                t["correct"] = t["correct"] and r["correct"]
    rows = sorted(table.values(), key=lambda t: (t["numel"], t["way"], not t["sync_each"]))
    print(f"{args.ranks} workers, {args.repeats} transfers per figure (ms per transfer, slower rank)")
    head = f"{'way':<18}{'KB':>8}{'sync each':>11}{'no sync':>9}{'correct':>9}"
    print(head)
    print("-" * len(head))
    for i in range(0, len(rows), 2):
        a, b = rows[i], rows[i + 1]
        print(f"{a['way']:<18}{a['bytes'] / 1024:>8.0f}{a['ms']:>11.2f}{b['ms']:>9.2f}{str(a['correct'] and b['correct']):>9}")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"args": vars(args), "rows": rows}, f, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
