"""Pipeline runtime on 2 msrun CPU ranks: measured bubble vs the simulator's prediction, and the
pipelined step time vs one process running the whole model.

For each schedule and microbatch count the workers time every step (compute steps synchronised);
measured bubble = 1 - busy compute time / wall time (mean over ranks). The simulator replays the
same exec order with the measured mean step costs (forward, backward or its halves, and the
fastest send/recv as the transfer cost) and predicts the bubble. Prints a table and writes
bench/results/pipeline.json.

    python bench/pipeline.py [--mode pynative|jit] [--width 1024] [--layers 8] [--batch 256]
"""
import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from mindformers_core.pipeline import simulate, stages_of_rank  # noqa: E402
from mindformers_core.testing import run_msrun  # noqa: E402

from bench.pipeline_body import SCHEDULES, single_process_step  # noqa: E402


def predicted(name, m, pp_size, mean):
    cls, per_rank, placement = SCHEDULES[name]
    stages = stages_of_rank(0, pp_size, per_rank, placement)
    sched = cls(stages[0], m) if per_rank == 1 else cls(stages, m)
    bwd = mean.get("BWD") or (mean.get("BWD_INPUT", 0) + mean.get("BWD_WEIGHT", 0))
    kwargs = {}
    if "BWD_INPUT" in mean:
        kwargs = {"bwd_input_time": mean["BWD_INPUT"], "bwd_weight_time": mean["BWD_WEIGHT"]}
    return simulate(sched.exec_order, fwd_time=mean["FWD"], bwd_time=bwd, comm_time=mean.get("comm", 0.0),
                    **kwargs)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", default="jit", choices=["pynative", "jit"])
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--micro", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--schedules", nargs="+", default=list(SCHEDULES))
    parser.add_argument("--threads", type=int, default=None,
                        help="CPU kernel threads per worker (MindSpore's default is 25)")
    parser.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "pipeline.json"))
    args = parser.parse_args()
    rows = run_msrun("bench.pipeline_body:run", 2, timeout=1800, kwargs={
        "schedules": args.schedules, "micro_batch_nums": args.micro, "mode": args.mode,
        "width": args.width, "layers": args.layers, "batch": args.batch, "threads": args.threads})
    baseline = single_process_step(args.width, args.layers, args.batch, args.mode)
    table = []
    for i, first in enumerate(rows[0]):
        per_rank = [r[i] for r in rows]
        wall = max(r["wall"] for r in per_rank)
        measured = 1 - sum(r["busy"] for r in per_rank) / (len(per_rank) * wall)
        mean = {}
        for key in ("FWD", "BWD", "BWD_INPUT", "BWD_WEIGHT"):
            values = [r["mean"][key] for r in per_rank if key in r["mean"]]
            if values:
                mean[key] = sum(values) / len(values)
        mean["comm"] = min(r["comm_min"] for r in per_rank)
        sim = predicted(first["schedule"], first["micro_batch_num"], len(per_rank), mean)
        table.append({"schedule": first["schedule"], "micro_batch_num": first["micro_batch_num"],
                      "step_s": wall, "single_process_s": baseline, "slowdown": wall / baseline,
                      "bubble_measured": measured, "bubble_simulated": sim.bubble_ratio,
                      "fwd_ms": mean["FWD"] * 1e3, "comm_ms": mean["comm"] * 1e3})
    print(f"mode={args.mode} width={args.width} layers={args.layers} batch={args.batch}, 2 ranks; "
          f"single process {baseline * 1e3:.1f} ms/step")
    head = f"{'schedule':<12}{'m':>3}{'ms/step':>9}{'vs 1 proc':>10}{'bubble meas':>12}{'bubble sim':>11}{'diff':>7}{'fwd ms':>8}{'p2p ms':>8}"
    print(head)
    print("-" * len(head))
    for t in table:
        print(f"{t['schedule']:<12}{t['micro_batch_num']:>3}{t['step_s'] * 1e3:>9.1f}{t['slowdown']:>9.2f}x"
              f"{t['bubble_measured']:>12.3f}{t['bubble_simulated']:>11.3f}"
              f"{t['bubble_measured'] - t['bubble_simulated']:>+7.3f}{t['fwd_ms']:>8.2f}{t['comm_ms']:>8.2f}")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"args": vars(args), "rows": table}, f, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
