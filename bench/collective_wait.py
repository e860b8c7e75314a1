"""Plain MindSpore 2.10 on CPU, 2 msrun workers: a rank waiting in an eager collective burns a whole core,
unless eager ops run in the calling thread (``pynative_synchronize``, our default on CPU: ``MFC_PYNATIVE_SYNC``).

Rank 1 reaches an ``ops.AllReduce`` ``--late`` seconds after rank 0; rank 0's process CPU over its call is
printed next to the same wait spent in ``time.sleep``: with MindSpore's dispatch queue (``MFC_PYNATIVE_SYNC=0``: the
calling thread waits for the queue in ``AsyncRQueue::Wait``, a bare loop), with the op in the calling thread (the
collective's own wait sleeps), and inside an ``ms.jit`` function. With fewer cores than ranks (the test suite's 4 and
8 ranks on 2 cores) a spinning rank takes the core the late rank needs. Measured numbers: docs/performance.md.

    python bench/collective_wait.py [--late 3] [--rounds 3]
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
    parser.add_argument("--late", type=float, default=3.0, help="seconds rank 1 arrives after rank 0")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "collective_wait.json"))
    args = parser.parse_args()
    runs = {}
    for name, sync, jit in (("eager op in the dispatch queue", "0", False),
                            ("eager op in the calling thread", "1", False), ("ms.jit graph", "1", True)):
        runs[name] = run_msrun("bench.collective_wait_body:run", 2,
                               kwargs={"late": args.late, "rounds": args.rounds, "jit": jit},
                               timeout=120 + 4 * args.late * args.rounds, env={"MFC_PYNATIVE_SYNC": sync})
    print(f"MindSpore {runs['ms.jit graph'][0]['mindspore']}, 2 workers, rank 1 {args.late:.1f} s late, "
          f"{args.rounds} rounds (rank 0, median [min-max])")
    print(f"{'rank 0 waiting in':<48}{'wall s':>20}{'CPU s (process)':>22}{'CPU s (main thread)':>22}")

    def cell(rows, key):
        vals = [r[key] for r in rows]
        return f"{statistics.median(vals):.2f} [{min(vals):.2f}-{max(vals):.2f}]"
    for name, per_rank in runs.items():
        rows = next(r for r in per_rank if r["rank"] == 0)["rows"]
        print(f"{'ops.AllReduce, ' + name:<48}{cell(rows, 'collective_wall'):>20}"
              f"{cell(rows, 'collective_cpu'):>22}{cell(rows, 'collective_main_thread_cpu'):>22}")
        print(f"{'  time.sleep (control)':<48}{cell(rows, 'sleep_wall'):>20}{cell(rows, 'sleep_cpu'):>22}")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"late": args.late, "rounds": args.rounds, "load": os.getloadavg(), "runs": runs}, f, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
