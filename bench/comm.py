"""Time and bytes per collective on 2 and 4 msrun CPU ranks, native vs emulated where both exist.

Prints a table and writes bench/results/comm.json. "buffer bytes" is what one rank hands to
MindSpore's underlying collective kernel (see kernels.py: emulations move more), "ring bytes" the
bytes a ring all-reduce/all-gather sends per rank for that buffer. Times are wall-clock per call
(slowest rank), PyNative, synchronised with asnumpy().

    python bench/comm.py [--ranks 2 4] [--sizes 16384 262144 1048576]
"""
import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from mindformers_core.testing import run_msrun  # noqa: E402


def buffer_bytes(op, path, nbytes, n):
    """Bytes entering the underlying kernel per rank for an input of ``nbytes``."""
    if path == "native":
        return nbytes
    # emulated, or mixed (emulated on a native all-gather of the input)
    return {"all_reduce_max": n * nbytes, "all_gather": n * nbytes, "all_to_all": n * nbytes}.get(op, nbytes)


def ring_bytes(op, path, buf, n):
    """Bytes a ring algorithm sends per rank for that buffer (all-gather: (n-1)/n, all-reduce 2x)."""
    if path == "native" and op == "all_gather":
        return (n - 1) * buf
    if path == "mixed":  # a native all-gather of the input
        return (n - 1) * buf // n
    if path == "native" and op == "broadcast":
        return buf
    return 2 * (n - 1) * buf // n


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--sizes", type=int, nargs="+", default=[16384, 262144, 1048576],
                        help="float32 elements per rank")
    parser.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "comm.json"))
    args = parser.parse_args()
    rows = []
    for n in args.ranks:
        per_rank = run_msrun("bench.comm_body:run", n, kwargs={"sizes": args.sizes}, timeout=900)
        for i, row in enumerate(per_rank[0]):
            row = dict(row)
            row["seconds"] = max(r[i]["seconds"] for r in per_rank)
            row["buffer_bytes"] = buffer_bytes(row["op"], row["path"], row["bytes"], n)
            row["ring_bytes_per_rank"] = ring_bytes(row["op"], row["path"], row["buffer_bytes"], n)
            rows.append(row)
    header = f"{'op':<16}{'ranks':>6}{'input KiB':>11}{'path':>10}{'buffer KiB':>12}{'ring KiB':>10}{'ms/call':>10}{'GB/s':>8}"
    print(header)
    print("-" * len(header))
    for r in rows:
        gbps = r["ring_bytes_per_rank"] / r["seconds"] / 1e9 if r["seconds"] else 0.0
        print(f"{r['op']:<16}{r['ranks']:>6}{r['bytes'] / 1024:>11.0f}{r['path']:>10}"
              f"{r['buffer_bytes'] / 1024:>12.0f}{r['ring_bytes_per_rank'] / 1024:>10.0f}"
              f"{r['seconds'] * 1e3:>10.2f}{gbps:>8.3f}")
    pairs = {}
    for r in rows:
        pairs.setdefault((r["op"], r["ranks"], r["bytes"]), {})[r["path"]] = r["seconds"]
    print("\nemulated / native time, where both exist:")
    for (op, n, b), paths in sorted(pairs.items()):
        base = paths.get("native") or paths.get("mixed")
        if base and "emulated" in paths:
            print(f"  {op:<14} ranks={n} {b // 1024:>6} KiB: {paths['emulated'] / base:.2f}x")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(rows, f, indent=1)
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
