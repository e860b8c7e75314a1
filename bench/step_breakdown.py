"""Where dp2's and tp2's step time goes, next to one process: bench/trainer.py's rows (the real
trainer, the same Llama and sizes) taken apart on every rank by bench/step_breakdown_body.py.

Per rank, per step (medians over the rounds), in ms: ``step`` (the trainer's step as the loop runs
it), ``compute`` (forward + backward less the collectives inside them), each ``collective`` the
step issues (kind, shape, how often; replayed alone right after a barrier: transfer only),
``optimizer`` (the update less its gradient reduction), ``host`` (step - grads - update: launch,
Python and the reads the one step does beyond its parts run alone), ``wait`` (time in a barrier
right after the step less the same barrier's own cost: waiting for the slower rank), and the CPU
seconds (user + sys, all threads) this process spent per step next to the step's wall seconds:
CPU/wall near 1 per process with 2 processes on 2 cores means nobody sleeps while it waits.

Each launch is one msrun job (or one process for 1proc); configs are run in turn, ``--repeats``
times (interleaved), medians with min-max over the repeats, and the machine load (uptime) is printed
and written with the figures.

    python bench/step_breakdown.py [--configs 1proc dp2 tp2] [--modes jit pynative] [--repeats 3]
                                   [--rounds 6] [--out bench/results/step_breakdown.json]
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bench.trainer import CONFIGS, assets, rows_per_microbatch, uptime  # noqa: E402
from mindformers_core.testing import run_msrun  # noqa: E402

ROWS = ("1proc", "dp2", "tp2")


def argv_of(name, mode, paths, out_dir):
    workers, flags = CONFIGS[name]
    return [str(a) for a in ["--config", paths["yaml"], "--output_dir", out_dir, "--mode", 0 if mode == "jit" else 1,
                             "--runner_config.max_steps", 1000, "--runner_config.batch_size",
                             rows_per_microbatch(name), *flags]]


def derive(rank):
    """The derived parts of one rank's result, seconds."""
    p = {k: v["wall_s"] for k, v in rank["parts"].items()}
    c = rank["collectives"]
    in_grads = sum(x["count_grads"] * (x["alone_s"] or 0.0) for x in c)
    in_update = sum(x["count_update"] * (x["alone_s"] or 0.0) for x in c)
    out = {"step": p["step"], "compute": p["grads"] - in_grads, "collectives_in_grads": in_grads,
           "reduce": p["reduce"], "collectives_in_update": in_update, "optimizer": p["update"] - p["reduce"],
           "host": p["step"] - p["grads"] - p["update"],
           "wait": max(0.0, (rank["barrier_s"] or 0.0) - (rank["barrier_idle_s"] or 0.0)),
           "cpu_step": rank["parts"]["step"]["cpu_s"],
           "cpu_per_wall_step": rank["parts"]["step"]["cpu_s"] / p["step"]}
    for k in ("grads", "update"):
        out[f"cpu_per_wall_{k}"] = rank["parts"][k]["cpu_s"] / p[k]
    return out


COLUMNS = ("step", "compute", "collectives_in_grads", "reduce", "optimizer", "host", "wait", "cpu_step",
           "cpu_per_wall_step", "cpu_per_wall_grads", "cpu_per_wall_update")
HEADS = ("step", "compute", "coll(fb)", "reduce", "optim", "host", "wait", "cpu s", "cpu/wall", "c/w fb", "c/w upd")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", nargs="+", default=list(ROWS), choices=list(ROWS))
    parser.add_argument("--modes", nargs="+", default=["jit"], choices=["jit", "pynative"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--env", nargs="+", default=[], metavar="LABEL:NAME=VALUE[,NAME=VALUE]",
                        help="also run every row with these environment settings (one variant each, interleaved "
                             "with the plain row), labelled LABEL in the table")
    parser.add_argument("--assets", default=os.path.join(ROOT, "bench", "results", "trainer_assets"))
    parser.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "step_breakdown.json"))
    args = parser.parse_args()
    paths = assets(args.assets)
    variants = [("", {})]
    for spec in args.env:
        label, _, pairs = spec.partition(":")
        if not label or "=" not in pairs:
            parser.error(f"--env {spec!r}: expected LABEL:NAME=VALUE[,NAME=VALUE]")
        variants.append((label, dict(kv.split("=", 1) for kv in pairs.split(","))))
    runs = []
    loads = [uptime()]
    for repeat in range(args.repeats):
        for mode in args.modes:
            for base in args.configs:
                for label, env in variants:
                    name = f"{base}{'+' + label if label else ''}"
                    start = time.time()
                    out_dir = tempfile.mkdtemp(prefix=f"bench_breakdown_{base}_{mode}_")
                    per_rank = run_msrun("bench.step_breakdown_body:run", CONFIGS[base][0],
                                         kwargs={"argv": argv_of(base, mode, paths, out_dir), "rounds": args.rounds,
                                                 "warmup": args.warmup}, timeout=1200, env=env)
                    runs.append({"config": name, "mode": mode, "repeat": repeat, "env": env, "ranks": per_rank,
                                 "derived": [derive(r) for r in per_rank], "load": os.getloadavg()[0]})
                    print(f"# {name} {mode} run {repeat + 1}/{args.repeats}: {time.time() - start:.0f} s, "
                          f"load {os.getloadavg()[0]:.1f}", flush=True)
    names = list(dict.fromkeys(r["config"] for r in runs))
    loads.append(uptime())
    print()
    print("per rank, per step, ms (median over the repeats of each run's median; [min-max] for step); CPU s per step "
          "of the process, CPU/wall of the step, of forward+backward alone (fb) and of the update alone")
    print(f"load: {loads[0]}  ->  {loads[-1]}")
    head = f"{'config':<14}{'mode':<9}{'rank':>4}" + "".join(f"{h:>10}" for h in HEADS)
    print(head)
    print("-" * len(head))
    summary = []
    for mode in args.modes:
        for name in names:
            rs = [r for r in runs if r["config"] == name and r["mode"] == mode]
            for rank in range(len(rs[0]["derived"])):
                vals = {k: [r["derived"][rank][k] for r in rs] for k in COLUMNS}
                med = {k: statistics.median(v) for k, v in vals.items()}
                summary.append({"config": name, "mode": mode, "rank": rank, "median": med,
                                "min": {k: min(v) for k, v in vals.items()}, "max": {k: max(v) for k, v in vals.items()}})
                cells = []
                for k in COLUMNS:
                    v = med[k]
                    cells.append(f"{v:>10.2f}" if k.startswith("cpu_per") else
                                 f"{v:>10.2f}" if k == "cpu_step" else f"{v * 1e3:>10.0f}")
                print(f"{name:<14}{mode:<9}{rank:>4}" + "".join(cells)
                      + f"   step [{min(vals['step']) * 1e3:.0f}-{max(vals['step']) * 1e3:.0f}]")
    print()
    print("collectives per step (rank 0 of the last run of each row): kind shape x count in grads / in update, "
          "alone ms")
    for mode in args.modes:
        for name in names:
            last = [r for r in runs if r["config"] == name and r["mode"] == mode][-1]
            for c in last["ranks"][0]["collectives"]:
                alone = f"{c['alone_s'] * 1e3:.2f}" if c["alone_s"] is not None else "-"
                print(f"  {name} {mode}: {c['kind']} {tuple(c['shape'])} {c['dtype']} x {c['count_grads']} / "
                      f"{c['count_update']}, alone {alone} ms")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"args": vars(args), "uptime": loads, "summary": summary, "runs": runs}, f, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
