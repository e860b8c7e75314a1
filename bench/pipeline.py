"""Pipeline runtime on msrun CPU ranks: measured bubble vs the simulator, activation memory the
runtime holds per stage vs the simulator's in-flight count, and the pipelined step time vs one
process running the whole model.

For each schedule and microbatch count the workers time every step of a few training steps
(compute steps synchronised) and report what the runtime held (``runtime.memory``). Bubble:

* measured: from the per-rank timelines of each recorded iteration (``timeline_from_trace``: time
  not computing, over ranks x makespan, where the makespan runs from the first step of any rank to
  the last; median over iterations); ``wall`` is the older figure, 1 - busy / the whole ``run()``
  call, which also counts the Python work around the steps;
* sim F/B: the simulator with the run's mean step costs per type (F, B or its halves, the fastest
  send/recv as the transfer cost);
* sim trace: the same order replayed with every step's own measured duration (mean over the
  iterations) and the fastest send/recv: compute costs are then exactly the run's, so what is left
  between it and the measurement is not schedule structure but what the simulator does not model --
  the gaps between steps (Python dispatch, ``gaps``) and transfers slower than the fastest one;
* +p2p: the same with each send/recv pair's own measured transfer (from the later of the two
  starts to the end), which should reproduce the measurement if blocking rendezvous is the model.

Memory: per stage, the peak number of microbatches whose stage input the runtime holds for the
backward (FWD until BWD / BWD_WEIGHT) and their bytes, next to the simulator's peak in flight (FWD
until the input gradient) and the same count until the weight gradient from the order; per rank the
peak of all the runtime's tables (saved inputs, activations and gradients waiting to move). The
allocator's peak (``mindspore.runtime.max_memory_allocated``) is read too; the CPU build reports
none. Prints tables and writes bench/results/pipeline.json.

    python bench/pipeline.py [--ranks 2] [--mode pynative|jit] [--width 1024] [--layers 8] [--batch 256] [--recompute]
"""
import argparse
import json
import os
import statistics
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from mindformers_core.pipeline import MetaStepType as T, simulate, stages_of_rank  # noqa: E402
from mindformers_core.pipeline.replay import replay  # noqa: E402
from mindformers_core.pipeline.render import parse_trace_rows, split_iterations, timeline_from_trace  # noqa: E402
from mindformers_core.testing import run_msrun  # noqa: E402

from bench.pipeline_body import SCHEDULES, single_process_step  # noqa: E402


def schedule_of(name, m, pp_size):
    cls, per_rank, placement = SCHEDULES[name]
    stages = stages_of_rank(0, pp_size, per_rank, placement)
    return cls(stages[0], m) if per_rank == 1 else cls(stages, m)


def simulated_mean_costs(sched, mean):
    bwd = mean.get("BWD") or (mean.get("BWD_INPUT", 0) + mean.get("BWD_WEIGHT", 0))
    kwargs = {}
    if "BWD_INPUT" in mean:
        kwargs = {"bwd_input_time": mean["BWD_INPUT"], "bwd_weight_time": mean["BWD_WEIGHT"]}
    return simulate(sched, fwd_time=mean["FWD"], bwd_time=bwd, comm_time=mean.get("comm", 0.0), **kwargs)


def _bubble(steps):
    makespan = max(t.end for ts in steps.values() for t in ts)
    busy = sum(t.end - t.start for ts in steps.values() for t in ts if t.step.type.is_compute)
    return 1 - busy / (makespan * len(steps)), makespan


def simulated_per_step(sched, runs_by_rank, comm=None):
    """Replay the order with each compute step's measured duration (mean over iterations) and, for
    send/recv, ``comm`` or (None) each pair's measured transfer: from the later of the two starts
    (both ranks there) to the earlier end -- the waiting for the peer taken out."""
    durations, starts, ends = {}, {}, {}
    for runs in runs_by_rank.values():
        for run in runs:
            for step, a, b in run:
                durations.setdefault(step, []).append(b - a)
    for runs in runs_by_rank.values():
        for i, run in enumerate(runs):
            for step, a, b in run:
                starts[(i, step)], ends[(i, step)] = a, b
    mean = {step: sum(v) / len(v) for step, v in durations.items()}
    transfer = {}
    for (i, step), a in starts.items():
        if step.type.is_p2p and (i, step.peer()) in starts:
            span = min(ends[(i, step)], ends[(i, step.peer())]) - max(a, starts[(i, step.peer())])
            transfer.setdefault(step, []).append(max(span, 0.0))
    transfer = {k: sum(v) / len(v) for k, v in transfer.items()}

    def cost(step):
        if step.type.is_compute:
            return mean[step]
        if step.type.is_p2p:
            return comm if comm is not None else transfer.get(step, 0.0)
        return 0.0
    return _bubble(replay(sched.exec_order, cost))


def held_until_weight_grad(sched):
    """Per stage, the peak of microbatches between FWD and BWD / BWD_WEIGHT along the order: what
    the runtime must hold (each rank runs its list in order)."""
    live, peak = {}, {}
    for steps in sched.exec_order.values():
        for st in steps:
            s = st.stage_index
            if st.type is T.FWD:
                live[s] = live.get(s, 0) + 1
                peak[s] = max(peak.get(s, 0), live[s])
            elif st.type in (T.BWD, T.BWD_WEIGHT):
                live[s] -= 1
    return dict(sorted(peak.items()))


def analyse(per_rank, baseline):
    first = per_rank[0]
    pp_size = len(per_rank)
    sched = schedule_of(first["schedule"], first["micro_batch_num"], pp_size)
    traces = {r["rank"]: parse_trace_rows(r["trace"], f"rank {r['rank']}") for r in per_rank}
    runs_by_rank = {rank: split_iterations(tr) for rank, tr in traces.items()}
    iterations = min(len(v) for v in runs_by_rank.values())
    measured, gaps = [], []
    for i in range(iterations):
        tl = timeline_from_trace(traces, iteration=i, scale=1.0)
        measured.append(tl.bubble_ratio)
        span = sum(ts[-1].end - ts[0].start for ts in tl.steps.values())
        inside = sum(t.end - t.start for ts in tl.steps.values() for t in ts)
        gaps.append(1 - inside / span)
    wall = max(r["wall"] for r in per_rank)
    wall_bubble = 1 - sum(r["busy"] for r in per_rank) / (pp_size * wall)
    mean = {}
    for key in ("FWD", "BWD", "BWD_INPUT", "BWD_WEIGHT"):
        values = [r["mean"][key] for r in per_rank if key in r["mean"]]
        if values:
            mean[key] = sum(values) / len(values)
    mean["comm"] = min(r["comm_min"] for r in per_rank)
    sim = simulated_mean_costs(sched, mean)
    per_step_bubble, _ = simulated_per_step(sched, runs_by_rank, mean["comm"])
    per_pair_bubble, _ = simulated_per_step(sched, runs_by_rank)
    runtime_held, held_bytes, table_bytes = {}, {}, {}
    for r in per_rank:
        for s, n in r["memory"]["peak_microbatches"].items():
            runtime_held[int(s)] = n
            held_bytes[int(s)] = r["memory"]["peak_bytes"][s]
        table_bytes[r["rank"]] = r["memory"]["peak_table_bytes"]
    return {"schedule": first["schedule"], "micro_batch_num": first["micro_batch_num"], "ranks": pp_size,
            "step_s": wall, "single_process_s": baseline, "slowdown": wall / baseline,
            "bubble_measured": statistics.median(measured), "bubble_measured_iterations": measured,
            "bubble_wall": wall_bubble, "bubble_sim_mean_costs": sim.bubble_ratio,
            "bubble_sim_per_step": per_step_bubble, "bubble_sim_per_step_and_transfer": per_pair_bubble,
            "gaps": statistics.median(gaps),
            "mean_costs_ms": {k: v * 1e3 for k, v in mean.items()},
            "memory": {"runtime_peak_microbatches": runtime_held, "runtime_peak_bytes": held_bytes,
                       "sim_peak_in_flight": {int(k): v for k, v in sim.peak_in_flight_per_stage.items()},
                       "order_peak_until_weight_grad": held_until_weight_grad(sched),
                       "microbatch_input_bytes": first["input_bytes"],
                       "runtime_peak_table_bytes_per_rank": table_bytes,
                       "allocator_peak_per_rank": {r["rank"]: r["allocator_peak"] for r in per_rank}}}


def _bwd_ms(mean):
    return mean.get("BWD") or mean.get("BWD_INPUT", 0) + mean.get("BWD_WEIGHT", 0)


def print_tables(args, table, baseline):
    print(f"mode={args.mode} width={args.width} layers={args.layers} batch={args.batch}, {args.ranks} ranks, "
          f"recompute={args.recompute}; "
          f"single process {baseline * 1e3:.1f} ms/step")
    head = (f"{'schedule':<12}{'m':>3}{'ms/step':>9}{'vs 1 proc':>10}{'bubble':>8}{'wall':>7}{'sim F/B':>8}"
            f"{'sim trace':>10}{'meas-trace':>11}{'+p2p':>6}{'gaps':>6}{'F ms':>7}{'B ms':>7}{'p2p ms':>7}")
    print(head)
    print("-" * len(head))
    for t in table:
        print(f"{t['schedule']:<12}{t['micro_batch_num']:>3}{t['step_s'] * 1e3:>9.1f}{t['slowdown']:>9.2f}x"
              f"{t['bubble_measured']:>8.3f}{t['bubble_wall']:>7.3f}{t['bubble_sim_mean_costs']:>8.3f}"
              f"{t['bubble_sim_per_step']:>10.3f}{t['bubble_measured'] - t['bubble_sim_per_step']:>+11.3f}"
              f"{t['bubble_sim_per_step_and_transfer']:>6.3f}{t['gaps']:>6.3f}{t['mean_costs_ms']['FWD']:>7.1f}"
              f"{_bwd_ms(t['mean_costs_ms']):>7.1f}{t['mean_costs_ms']['comm']:>7.2f}")
    print()
    print("memory per stage: microbatches whose stage input the runtime held for the backward (peak), the simulator's")
    print("peak in flight (FWD..input grad) and the order's count until the weight grad; MB held; per-rank table peak")
    head = (f"{'schedule':<12}{'m':>3}{'stage':>6}{'runtime':>8}{'sim':>5}{'until W':>8}{'MB held':>9}"
            f"{'MB tables(rank)':>16}{'allocator':>10}")
    print(head)
    print("-" * len(head))
    for t in table:
        mem = t["memory"]
        for s in sorted(mem["runtime_peak_microbatches"]):
            rank = schedule_of(t["schedule"], t["micro_batch_num"], t["ranks"]).placement[s]
            alloc = mem["allocator_peak_per_rank"][rank]
            print(f"{t['schedule']:<12}{t['micro_batch_num']:>3}{s:>6}{mem['runtime_peak_microbatches'][s]:>8}"
                  f"{mem['sim_peak_in_flight'].get(s, 0):>5}{mem['order_peak_until_weight_grad'].get(s, 0):>8}"
                  f"{mem['runtime_peak_bytes'][s] / 2 ** 20:>9.2f}"
                  f"{mem['runtime_peak_table_bytes_per_rank'][rank] / 2 ** 20:>13.2f}({rank})"
                  f"{'n/a' if alloc is None else f'{alloc / 2 ** 20:.1f}':>10}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2, help="pipeline ranks (msrun workers)")
    parser.add_argument("--mode", default="jit", choices=["pynative", "jit"])
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--micro", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--steps", type=int, default=3, help="recorded training steps per configuration")
    parser.add_argument("--schedules", nargs="+", default=list(SCHEDULES))
    parser.add_argument("--threads", type=int, default=None,
                        help="CPU kernel threads per worker (MindSpore's default is 25)")
    parser.add_argument("--recompute", action="store_true",
                        help="PipelineStage(recompute=True): the backward runs the stage forward again")
    parser.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "pipeline.json"))
    args = parser.parse_args()
    if args.layers % (2 * args.ranks):
        parser.error(f"--layers={args.layers} must be a multiple of 2 x --ranks={args.ranks} (two stages per rank "
                     "for the interleaved and V schedules)")
    rows = run_msrun("bench.pipeline_body:run", args.ranks, timeout=1800, kwargs={
        "schedules": args.schedules, "micro_batch_nums": args.micro, "mode": args.mode, "steps": args.steps,
        "width": args.width, "layers": args.layers, "batch": args.batch, "threads": args.threads,
        "recompute": args.recompute})
    baseline = single_process_step(args.width, args.layers, args.batch, args.mode)
    table = [analyse([r[i] for r in rows], baseline) for i in range(len(rows[0]))]
    print_tables(args, table, baseline)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"args": vars(args), "rows": table}, f, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
