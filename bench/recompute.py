"""Recompute and swap on Llama (mindformers_core.models; research/llama YAMLs, tiny and ~100M): memory
held for backward, step time and extra forward FLOPs for none / select / full recompute and swap, in
PyNative and under ms.jit.

Per model, one process measures memory (PyNative) and one process per mode measures time:

* ``held`` / ``peak``: bytes of activations held for backward at the end of the forward, and their
  peak during the backward (recomputed units bring theirs back). Counted in PyNative through
  MindSpore's ``saved_tensors_hooks`` (``ActivationMeter``: every saved buffer once, weights apart).
  Not observable inside a compiled graph, and MindSpore's CPU build has no allocator statistics, so
  jit has no activation-memory figure ("-"); the JSON keeps the process's resident-memory peak over
  the first step (``rss_first_step_bytes``), dominated by compilation and the graph's memory pool;
* ``host``: bytes the swap units copied to host memory (PyNative; under jit swap is MindSpore's graph
  offload, which does nothing on CPU);
* ``step`` / ``cpu``: all configurations of a (model, mode) are built in one process and stepped
  round-robin (forward + backward, ``value_and_grad``, no optimizer) after a first step, so load
  from other jobs on the shared machine falls on all of them alike. ``step`` is the fastest wall
  time, ``cpu`` the median process CPU time (all threads) per step. On the shared 2-core machine a
  100M step took 2-4x longer in some rounds than in others while its CPU time varied by ~20%,
  so ``vs none`` compares CPU time (the work done);
* ``extra FLOPs``: theory = forward FLOPs of the recompute units (matmuls 2mnk, softmax 5 and SwiGLU
  5 flops per element), as a % of the step (about 3x the forward); ``counted`` = recomputations the
  units actually ran (PyNative) x their FLOPs; ``pred`` = the cost ratio the theory predicts, to
  compare with ``vs none``. Under jit ``matmuls`` counts MatMul nodes of the compiled graph (tiny
  model): the compiler recomputes only what the backward needs.

Prints a table and writes bench/results/recompute.json.

    python bench/recompute.py [--models tiny 100m] [--modes pynative jit] [--configs none select full swap]
"""
import argparse
import glob
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

MODELS = {"tiny": ("research/llama/llama_tiny.yaml", 4), "100m": ("research/llama/llama_100m.yaml", 1)}
CONFIGS = {   # name -> (recompute config, swap config)
    "none": (None, None),
    "select": ("select", None),                     # attention core + MLP activation of every layer
    "full": ("full", None),                         # every layer
    "swap": (None, ["core_attention", "mlp.act"]),  # the same Cells as select, swapped instead
}


# ---- analytic FLOPs -------------------------------------------------------------------------------
def unit_flops(cfg, b):
    """Forward FLOPs of one layer's pieces for batch b (see the module docstring for the rules)."""
    s, h, f, n, g, d = (cfg.seq_length, cfg.hidden_size, cfg.ffn_hidden_size, cfg.num_attention_heads,
                        cfg.query_groups, cfg.head_dim)
    core = 2 * 2 * b * n * s * s * d + 5 * b * n * s * s
    act = 5 * b * s * f
    proj = 2 * b * s * h * (n * d + 2 * g * d) + 2 * b * s * n * d * h
    mlp = 2 * b * s * h * f * (2 if cfg.activation == "swiglu" else 1) + 2 * b * s * f * h + act
    norms = 2 * 4 * b * s * h
    layer = core + proj + mlp + norms
    head = 2 * b * s * h * cfg.vocab_size + 5 * b * s * cfg.vocab_size
    return {"core_attention": core, "act": act, "layer": layer, "forward": cfg.num_layers * layer + head}


def flops_of_unit(name, fl):
    if name.endswith("core_attention"):
        return fl["core_attention"]
    if name.endswith(".act"):
        return fl["act"]
    if re.fullmatch(r".*layers\.\d+", name):
        return fl["layer"]
    return 0


class RssPeak:
    """Peak resident memory of this process while inside the block (sampled every 5 ms)."""

    def __init__(self):
        import psutil
        self.proc = psutil.Process()
        self.peak = self.base = self.proc.memory_info().rss
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, self.proc.memory_info().rss)
            time.sleep(0.005)

    def __enter__(self):
        self.peak = self.base = self.proc.memory_info().rss
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


# ---- workers (own processes) -----------------------------------------------------------------------
def _setup(spec):
    import numpy as np
    import yaml
    import mindspore as ms
    from mindspore import Tensor
    from mindformers_core.models.llama import LlamaConfig

    if spec.get("threads"):
        ms.device_context.cpu.op_tuning.threads_num(spec["threads"])
    path, batch = MODELS[spec["model"]]
    with open(os.path.join(ROOT, path)) as fh:
        cfg = LlamaConfig.from_model_config(yaml.safe_load(fh)["model"]["model_config"])
    batch = spec.get("batch") or batch
    rng = np.random.RandomState(0)
    ids = Tensor(rng.randint(0, cfg.vocab_size, (batch, cfg.seq_length)), ms.int32)
    labels = Tensor(rng.randint(0, cfg.vocab_size, (batch, cfg.seq_length)), ms.int32)
    return cfg, batch, ids, labels


def _build(cfg, name):
    import mindspore as ms
    from mindformers_core.recompute import apply_recompute, apply_swap
    from mindformers_core.models.llama import LlamaForCausalLM

    ms.set_seed(0)
    model = LlamaForCausalLM(cfg)
    recompute, swap = CONFIGS[name]
    units = []
    if recompute:
        units += apply_recompute(model, recompute).names
    if swap:
        units += apply_swap(model, swap).names
    return model, units


def memory_worker(spec):
    """PyNative: bytes held for backward per config (ActivationMeter), recomputations counted."""
    from mindformers_core.recompute import ActivationMeter

    cfg, batch, ids, labels = _setup(spec)
    fl = unit_flops(cfg, batch)
    out = {}
    for name in spec["configs"]:
        model, units = _build(cfg, name)
        meter = ActivationMeter(model)
        row = meter.measure(model, ids, labels, weights=model.trainable_params())
        row.update(units=len(units), loss=float(meter.loss.asnumpy()), recomputations=sum(meter.recomputed.values()),
                   counted_extra_flops=sum(n * flops_of_unit(u, fl) for u, n in meter.recomputed.items()),
                   swapped_bytes=sum(meter.swapped.values()))
        out[name] = row
        del model, meter
    return out


def time_worker(spec):
    """All configs built in one process and stepped round-robin, so load from other jobs on the
    machine falls on every config alike; under jit with ``ir`` the compiled graph's MatMuls are counted."""
    import mindspore as ms
    from mindformers_core.recompute import allocator_peak

    cfg, batch, ids, labels = _setup(spec)
    fns, out = {}, {}
    for name in spec["configs"]:
        model, units = _build(cfg, name)
        fn = ms.value_and_grad(model, None, model.trainable_params())
        if spec["mode"] == "jit":
            fn = ms.jit(fn)
            if spec.get("ir"):
                ms.set_context(save_graphs=1, save_graphs_path=os.path.join(spec["ir"], name))
        start = time.perf_counter()
        with RssPeak() as rss:
            loss, grads = fn(ids, labels)
            loss.asnumpy()
            del grads
        if spec["mode"] == "jit" and spec.get("ir"):
            ms.set_context(save_graphs=0)
        out[name] = {"units": len(units), "first_step_s": time.perf_counter() - start, "loss": float(loss.asnumpy()),
                     "rss_first_step_bytes": rss.peak - rss.base, "wall": [], "cpu": [],
                     "graph_matmuls": _graph_matmuls(os.path.join(spec["ir"], name)) if spec.get("ir") else None}
        fns[name] = (model, fn)
    for _ in range(spec["rounds"]):
        for name, (_, fn) in fns.items():
            start, start_cpu = time.perf_counter(), time.process_time()
            loss, grads = fn(ids, labels)
            loss.asnumpy()
            out[name]["wall"].append(time.perf_counter() - start)
            out[name]["cpu"].append(time.process_time() - start_cpu)
            del grads
    for row in out.values():
        row["step_s"] = min(row["wall"])
        row["step_median_s"] = statistics.median(row["wall"])
        row["cpu_s"] = statistics.median(row["cpu"])
        row["allocator_peak"] = allocator_peak()
    return out


def _graph_matmuls(ir_dir):
    """MatMul nodes in the last backend graph MindSpore dumped for the compiled step."""
    files = glob.glob(os.path.join(ir_dir, "**", "hwopt_cpu_custom_optimization_after*.ir"), recursive=True)
    if not files:
        return None
    best = max(files, key=os.path.getsize)
    with open(best, errors="replace") as fh:
        return len(re.findall(r"= PrimFunc_(?:MatMul|BatchMatMul)\w*\(", fh.read()))


def run_one(spec, timeout):
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("GLOG_v", "3")
    with tempfile.TemporaryDirectory(prefix="mfc_recompute_bench_") as tmp:
        if spec.get("ir"):
            spec = dict(spec, ir=os.path.join(tmp, "ir"))
        proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", json.dumps(spec)],
                              capture_output=True, text=True, timeout=timeout, env=env, cwd=tmp)
    lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    if proc.returncode or not lines:
        raise RuntimeError(f"{spec}: worker failed (rc={proc.returncode})\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT "):])


# ---- table ----------------------------------------------------------------------------------------
def render(rows):
    """Ratios against ``none`` and the table."""
    for row in rows:
        base = next(r for r in rows if (r["model"], r["mode"], r["config"]) == (row["model"], row["mode"], "none"))
        row["vs_none"] = row["cpu_s"] / base["cpu_s"]
        row["wall_vs_none"] = row["step_s"] / base["step_s"]
        row["loss_equal_to_none"] = row["loss"] == base["loss"]
    mb = 1 / 2 ** 20
    print()
    head = (f"{'model':5} {'mode':8} {'config':6} {'units':>5} {'held MB':>8} {'peak MB':>8} {'host MB':>8} "
            f"{'step s':>7} {'cpu s':>7} {'vs none':>7} {'theory %':>8} {'counted %':>9} {'pred':>5} {'matmuls':>7}")
    print(head)
    print("-" * len(head))
    for r in rows:
        def mbs(key):
            return f"{r[key] * mb:8.1f}" if r.get(key) is not None else f"{'-':>8}"
        counted = (f"{100.0 * r['counted_extra_flops'] / (3 * r['forward_flops']):9.1f}"
                   if "counted_extra_flops" in r else f"{'-':>9}")
        print(f"{r['model']:5} {r['mode']:8} {r['config']:6} {r['units']:5d} {mbs('held_after_forward')} "
              f"{mbs('peak')} {mbs('host_after_forward')} {r['step_s']:7.3f} {r['cpu_s']:7.3f} "
              f"{r['vs_none']:7.2f} {r['theory_extra_pct_of_step']:8.1f} {counted} "
              f"{1 + r['theory_extra_pct_of_step'] / 100:5.2f} "
              f"{r['graph_matmuls'] if r.get('graph_matmuls') is not None else '-':>7}")
    print("\nheld/peak: activation bytes kept for backward (PyNative saved-tensor count); host: swapped to host; "
          "step: fastest wall time; cpu: median process CPU time per step (vs none: its ratio); theory/counted: "
          "extra forward FLOPs as % of a step (3x forward); pred: cost ratio the theory predicts; matmuls: MatMul "
          "nodes in the compiled graph (jit)")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["tiny", "100m"], choices=list(MODELS))
    parser.add_argument("--modes", nargs="+", default=["pynative", "jit"], choices=["pynative", "jit"])
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument("--rounds", type=int, default=None,
                        help="timed steps per config, round-robin (default: 5 tiny, 3 for 100m)")
    parser.add_argument("--threads", type=int, default=2, help="CPU kernel threads (MindSpore's default is 25)")
    parser.add_argument("--batch", type=int, default=None, help="override the batch size")
    parser.add_argument("--no-ir", dest="ir", action="store_false", help="skip the compiled-graph MatMul count")
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--table", default=None, metavar="JSON", help="print the table of an earlier run and exit")
    parser.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "recompute.json"))
    args = parser.parse_args()
    if args.worker:
        spec = json.loads(args.worker)
        work = memory_worker if spec["kind"] == "memory" else time_worker
        print("RESULT " + json.dumps(work(spec)), flush=True)
        return
    if args.table:
        with open(args.table) as fh:
            render(json.load(fh)["rows"])
        return

    import yaml
    from mindformers_core.models.llama import LlamaConfig

    rows = []
    for model in args.models:
        with open(os.path.join(ROOT, MODELS[model][0])) as fh:
            cfg = LlamaConfig.from_model_config(yaml.safe_load(fh)["model"]["model_config"])
        batch = args.batch or MODELS[model][1]
        fl = unit_flops(cfg, batch)
        theory = {"none": 0, "swap": 0, "select": cfg.num_layers * (fl["core_attention"] + fl["act"]),
                  "full": cfg.num_layers * fl["layer"]}
        base = {"model": model, "batch": batch, "configs": args.configs, "threads": args.threads}
        print(f"running {model}: memory (PyNative) ...", flush=True)
        memory = run_one(dict(base, kind="memory"), args.timeout)
        for mode in args.modes:
            print(f"running {model}: step times ({mode}) ...", flush=True)
            timed = run_one(dict(base, kind="time", mode=mode, ir=args.ir and model == "tiny" and mode == "jit",
                                 rounds=args.rounds or (5 if model == "tiny" else 3)), args.timeout)
            for name in args.configs:
                row = dict(timed[name], model=model, mode=mode, config=name, forward_flops=fl["forward"],
                           theory_extra_flops=theory[name],
                           theory_extra_pct_of_step=100.0 * theory[name] / (3 * fl["forward"]))
                if mode == "pynative":
                    row.update({k: v for k, v in memory[name].items() if k not in row or k == "units"})
                rows.append(row)
    render(rows)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as fh:
        json.dump({"rows": rows, "note": "CPU, 2 cores shared with other jobs: wall times of one step swung 2-4x "
                   "between rounds; vs_none compares median process CPU time (varied ~20%)"}, fh, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
