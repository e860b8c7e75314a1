"""A Qwen3-0.6B-shaped Hugging Face folder (issue 41 items 4 and 5): load, forward, training step, tp2 training
step, generation and the model's matmuls alone -- ours against PyTorch 2.13 + transformers on the same folder.

The folder (28 layers, hidden 1024, 16 q / 8 kv heads of 128, FFN 3072, vocab 151936, tied embeddings, bf16,
1.19 GB; random weights) is ``--folder DIR``, else made in a temporary directory by bench/real_size_folder.py under
``--peer-python`` (the torch venv's interpreter; default $MFC_TORCH_PYTHON). ``--layers N`` makes one of N layers
instead (for a dry run: ``--layers 2 --repeats 1``).

Every measurement is a fresh process (bench/real_size_body.py; ours under this interpreter, torch's under
``--peer-python``; torch never imported by the project's interpreter), the rows interleaved within each of
``--repeats`` rounds, so that a slow moment of the shared machine hits every row alike; the table shows medians
over the repeats [min-max] and ratios ours/torch (medians; min-max of the ratios paired by repeat). Rows
(``--rows``, comma-separated):

- ``load``: ``from_pretrained(folder)`` wall seconds, MB/s of the folder's safetensors bytes, and the peak RSS
  (VmHWM) over the RSS after the imports against the bytes the model's parameters hold; transformers'
  ``AutoModelForCausalLM.from_pretrained(folder, dtype=float32)`` the same.
- ``fwd64`` / ``fwd512``: logits of ids (1, 64) / (1, 512): PyNative (a call after a first one), jit (the project's
  ``compile_blocking`` = ``ms.jit`` launched in the calling thread: steady = median of ``--calls`` calls after the
  first, compile = first - steady) and transformers' eager forward under ``torch.no_grad``. The model is built
  by ``from_pretrained(folder)``; if the first call fails on the length (a model that takes only ``seq_length``
  tokens) it is rebuilt with ``seq_length=N``: the ``built`` line says which. The last position's logits of ours
  (PyNative) and transformers' are compared (repeat 1).
- ``train``: one training step, batch 1, seq 256, AdamW lr 1e-5 (betas 0.9/0.999, eps 1e-8, no decay), fp32, no
  clipping: ``ms.value_and_grad(model)`` + the project's ``AdamW`` (its fused kernel), PyNative and jit
  (one compiled step); ``torch.optim.AdamW`` with ``loss.backward()``. Step seconds = median of the steps after
  the first (and ``--warmup`` more), compile = first step - that; peak RSS of the process beside the analytic
  weights + gradients + two AdamW moments (4 x params x 4 bytes).
- ``tp2``: the same step through the trainer (run_mindformer.py under msrun via scripts/msrun_launcher.sh, 2
  workers, tensor parallel 2, the folder as ``pretrained_model_dir`` and ``load_checkpoint``, seq 256, batch 1,
  AdamW lr 1e-5, no clipping / bad-step guard / gradient norm, a text corpus tokenized by the Qwen3 test fixture's
  tokenizer.json (320 pieces), jit): rank 0's ``step_time_s`` (median after the first step and ``--warmup``),
  compile = first - that, each rank's peak RSS (sampled) beside half the analytic bytes.
- ``gen1`` / ``gen4``: ``Generator(model, GenerationConfig(max_new_tokens=32, eos_token_id=[]), jit=True)`` on 1 / 4
  prompts of 32 tokens: compile = first generate - the median of the next ``--gen-runs`` - 1, first-token latency
  = the prefill seconds of those, prefill and decode tokens/s (GenerationStats); transformers'
  ``generate(do_sample=False, max_new_tokens=32)`` (its KV cache; EOS off): first token = a generate of 1 new
  token, decode tokens/s = rows x 31 / (time of 32 - time of 1); the greedy ids of 1 prompt compared.
- ``matmul64`` / ``matmul256``: the model's matmuls alone over 64 / 256 tokens -- per layer q, k, v, o, gate, up,
  down (x layers, a weight each) and the vocabulary head, float32 -- with plain MindSpore's ``ops.matmul``
  (PyNative), ``torch.matmul`` and NumPy's ``@``: seconds per pass (median after the first of ``--matmul-passes``)
  and GFLOP/s. Beside the forward rows this shows which part of a gap is MindSpore's kernels.

Targets (issue 41): jit train step <= 1.5x torch eager; PyNative forward <= 3x transformers'; decode >= 0.5x
transformers' tokens/s; first token < 2 s after compile; load >= 200 MB/s with peak <= 1.3x held.

``--compile-sweep`` (the issue's bench/compile.py): compile seconds against depth (``--sweep-layers 2,8,28``) of the
forward (1, 64), the training step (1, 256) and a generate (1 prompt of 32, 32 new tokens), on random-weight models
built from the folder's config.json with ``num_layers`` overridden (``spec.model_class(spec.config_class.
from_model_config(dict(cfg, num_layers=L)))``); only config.json is read (without ``--folder`` one is written).
Target: a 28-layer compile <= 2x a 2-layer one.

Threads: ``--threads`` (default: the cores of this machine) for MindSpore's CPU kernels
(``device_context.cpu.op_tuning.threads_num``, with eager ops in the calling thread: the trainer's CPU defaults)
and ``torch.set_num_threads`` alike; the tp2 row keeps the trainer's default (cores // workers).

    python bench/real_size.py --folder /work/qwen3_06b --repeats 3 --json bench/results/real_size.json
    python bench/real_size.py --layers 2 --repeats 1 --peer-python /work/refvenv/bin/python   # a dry run
    python bench/real_size.py --folder /work/qwen3_06b --compile-sweep --sweep-layers 2,8,28
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
BODY = os.path.join(ROOT, "bench", "real_size_body.py")
FOLDER_SCRIPT = os.path.join(ROOT, "bench", "real_size_folder.py")
ROWS = ("load", "fwd64", "fwd512", "train", "tp2", "gen1", "gen4", "matmul64", "matmul256")
TRAIN_SEQ, PROMPT, NEW = 256, 32, 32
TOKENIZER = os.path.join(ROOT, "tests", "data", "hf", "qwen3", "tokenizer.json")
TARGETS = {"load_mb_s": 200.0, "load_peak_over_held": 1.3, "fwd_pynative": 3.0, "train_jit": 1.5,
           "decode": 0.5, "first_token_s": 2.0, "compile_depth": 2.0}


# ---- running one measurement --------------------------------------------------------------------------------
def run_body(python, row, args, timeout, torch=False):
    """bench/real_size_body.py ROW in a fresh process; its RESULT dict (raises with the output's tail)."""
    env = dict(os.environ)
    if torch:
        env.pop("PYTHONPATH", None)
    if row == "numpy_matmul" and args.get("threads"):
        for key in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
            env[key] = str(args["threads"])
    env.setdefault("GLOG_v", "3")
    t0 = time.monotonic()
    proc = subprocess.run([python, BODY, row, json.dumps(args)], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)
    line = next((ln for ln in reversed(proc.stdout.splitlines()) if ln.startswith("RESULT ")), None)
    if proc.returncode or line is None:
        raise RuntimeError(f"{row}: exit {proc.returncode}\n{(proc.stdout + proc.stderr)[-3000:]}")
    out = json.loads(line[len("RESULT "):])
    out["process_wall"] = time.monotonic() - t0
    out["load_average"] = os.getloadavg()[0]
    return out


def tp2_yaml(root, folder, seq, steps):
    """The trainer YAML of the tp2 row: configs/llama_tiny.yaml with the model from ``folder``."""
    import yaml
    from mindformers_core.data.corpus import build_corpus
    corpus = os.path.join(ROOT, "bench", "results", "real_size_assets", "corpus.txt")
    if not os.path.exists(corpus):
        os.makedirs(os.path.dirname(corpus), exist_ok=True)
        build_corpus(corpus, max_bytes=400_000)
    with open(os.path.join(ROOT, "configs", "llama_tiny.yaml")) as f:
        raw = yaml.safe_load(f)
    raw["model"] = {"model_config": {"seq_length": seq, "compute_dtype": "float32", "param_init_dtype": "float32"}}
    raw["pretrained_model_dir"] = raw["load_checkpoint"] = folder
    # a Hugging Face tokenizer smaller than the model's vocabulary is accepted (the real Qwen3's is too); the
    # folder made here has none, so the Qwen3 test fixture's (320 pieces) tokenizes the corpus
    raw["train_dataset"].update(dataset_dir=corpus, tokenizer_file=TOKENIZER)
    raw["optimizer"].update(learning_rate=1e-5, betas=[0.9, 0.999], eps=1e-8, weight_decay=0.0)
    raw["lr_schedule"].update(learning_rate=1e-5, lr_end=1e-5, warmup_steps=0)
    raw["lr_schedule"].pop("warmup_ratio", None)
    raw["runner_config"].update(batch_size=1, epochs=100, max_steps=steps, max_grad_norm=0,
                                use_skip_step_on_nan=False, log_grad_norm=False)
    raw["callbacks"] = [{"type": "MFLossMonitor", "per_print_times": 1}]
    path = os.path.join(root, "real_size_tp2.yaml")
    with open(path, "w") as f:
        yaml.safe_dump(raw, f, sort_keys=False)
    return path


def run_tp2(folder, steps, warmup, timeout, mode="jit"):
    """The trainer at tp2 (2 msrun workers) on the folder: rank 0's step times, each rank's peak RSS."""
    from bench.trainer import RssWatch, free_port
    out_dir = tempfile.mkdtemp(prefix="real_size_tp2_")
    config = tp2_yaml(out_dir, folder, TRAIN_SEQ, steps)
    argv = ["run_mindformer.py", "--config", config, "--output_dir", out_dir, "--mode", 0 if mode == "jit" else 1,
            "--use_parallel", "True", "--parallel_config.model_parallel", 2]
    command = " ".join(shlex.quote(str(a)) for a in argv)
    env = dict(os.environ)
    env.pop("MFC_CPU_THREADS", None)
    t0 = time.monotonic()
    proc = subprocess.Popen(["bash", os.path.join(ROOT, "scripts", "msrun_launcher.sh"), command, "2",
                             str(free_port()), os.path.join(out_dir, "msrun_log"), "True", str(int(timeout))],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    watch = RssWatch(proc.pid, "run_mindformer", period=0.5)
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        output += f"\nkilled after {timeout} s"
    rss = watch.finish()
    records = []
    loss_log = os.path.join(out_dir, "loss.jsonl")
    if os.path.exists(loss_log):
        with open(loss_log) as f:
            records = [json.loads(line) for line in f if line.strip()]
    if len(records) < steps:
        logs = output
        for r in range(2):      # the workers' own logs hold their tracebacks
            path = os.path.join(out_dir, "msrun_log", f"worker_{r}.log")
            if os.path.exists(path):
                with open(path, errors="replace") as f:
                    logs += f.read()
        errors = [ln.strip() for ln in logs.splitlines()
                  if re.match(r"\s*(\w+Error|Exception)\b.*:", ln) or "problem(s) in" in ln]
        why = errors[-1][:240] if errors else f"{len(records)} of {steps} steps logged"
        shutil.rmtree(out_dir, ignore_errors=True)     # the reason and the output's tail go into the JSON
        raise RuntimeError(f"tp2 {mode}: exit {proc.returncode}: {why}\n{output[-3000:]}")
    shutil.rmtree(out_dir, ignore_errors=True)     # the YAML, logs and loss.jsonl: read
    times = [r["step_time_s"] for r in records]
    steady = statistics.median(times[1 + warmup:] or times[1:])
    return {"times": times, "first": times[0], "steady": steady, "compile": times[0] - steady,
            "losses": [r["loss"] for r in records], "peak_rss": rss, "exit": proc.returncode,
            "process_wall": time.monotonic() - t0, "load_average": os.getloadavg()[0]}


# ---- the plan: which measurements, in which order ----------------------------------------------------------
def prompts_of(vocab, rows, seed=1):
    import numpy as np
    return np.random.default_rng(seed).integers(0, vocab, (rows, PROMPT)).tolist()


def plan(a, folder, vocab):
    """[(key, kind, row, args)]: kind 'ms', 'torch' (body rows) or 'tp2' (the trainer)."""
    base = {"folder": folder, "threads": a.threads}
    jobs = []
    for name in a.rows:
        if name == "load":
            jobs += [("load/ours", "ms", "ms_load", base), ("load/torch", "torch", "torch_load", base)]
        elif name.startswith("fwd"):
            n = int(name[3:])
            for mode in ("pynative", "jit"):
                jobs.append((f"{name}/{mode}", "ms", "ms_forward", dict(base, length=n, mode=mode, calls=a.calls)))
            jobs.append((f"{name}/torch", "torch", "torch_forward", dict(base, length=n, calls=a.calls)))
        elif name == "train":
            for mode in a.train_modes:
                jobs.append((f"train/{mode}", "ms", "ms_train", dict(base, length=TRAIN_SEQ, mode=mode,
                                                                     steps=a.steps, warmup=a.warmup)))
            jobs.append(("train/torch", "torch", "torch_train", dict(base, length=TRAIN_SEQ, steps=a.steps,
                                                                     warmup=a.warmup)))
        elif name == "tp2":
            for mode in a.tp2_modes:
                jobs.append((f"tp2/{mode}", "tp2", None, {"steps": a.steps, "warmup": a.warmup, "mode": mode}))
        elif name.startswith("gen"):
            prompts = prompts_of(vocab, int(name[3:]))
            g = dict(base, prompts=prompts, new=NEW, runs=a.gen_runs)
            jobs += [(f"{name}/ours", "ms", "ms_generate", g), (f"{name}/torch", "torch", "torch_generate", g)]
        elif name.startswith("matmul"):
            m = dict(base, tokens=int(name[6:]), passes=a.matmul_passes)
            jobs += [(f"{name}/mindspore", "ms", "ms_matmul", m), (f"{name}/torch", "torch", "torch_matmul", m),
                     (f"{name}/numpy", "ms", "numpy_matmul", m)]
    return jobs


def sweep_plan(a, folder):
    base = {"folder": folder, "threads": a.threads, "calls": max(2, a.calls), "prompt": PROMPT, "new": NEW}
    jobs = []
    for layers in a.sweep_layers:
        for what, n in (("forward", 64), ("train", TRAIN_SEQ), ("generate", None)):
            jobs.append((f"{what}/L{layers}", "ms", "ms_compile", dict(base, what=what, length=n, layers=layers)))
    return jobs


def measure(jobs, a, repeats, torch_python, folder, scratch):
    """Every job once per repeat, in turn; {key: [result or {'error': ...}, ...]}."""
    runs = {key: [] for key, *_ in jobs}
    for r in range(repeats):
        for key, kind, row, args in jobs:
            t0 = time.monotonic()
            args = dict(args)
            if row in ("ms_forward", "torch_forward") and r == 0:   # the last position's logits, compared once
                args["save"] = os.path.join(scratch, key.replace("/", "_") + ".npy")
            try:
                if kind == "tp2":
                    result = run_tp2(folder, args["steps"], args["warmup"], a.timeout, args["mode"])
                elif kind == "torch":
                    if torch_python is None:
                        raise RuntimeError("no --peer-python (an interpreter with torch and transformers)")
                    result = run_body(torch_python, row, args, a.timeout, torch=True)
                else:
                    result = run_body(sys.executable, row, args, a.timeout)
            except (RuntimeError, subprocess.TimeoutExpired) as e:
                text = str(e).strip()
                result = {"error": text.splitlines()[0][:300] if text else type(e).__name__, "detail": text[-3000:]}
            runs[key].append(result)
            state = "error: " + result["error"] if "error" in result else "ok"
            print(f"# repeat {r + 1}/{repeats} {key}: {time.monotonic() - t0:.0f} s, load average "
                  f"{os.getloadavg()[0]:.1f}, {state}", flush=True)
    return runs


# ---- summaries ----------------------------------------------------------------------------------------------
def stat(values):
    values = [v for v in values if v is not None]
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "values": values}


def ok_runs(runs, key):
    return [r for r in runs.get(key, []) if "error" not in r]


def field(runs, key, name, fn=None):
    rs = ok_runs(runs, key)
    return stat([fn(r) if fn else r.get(name) for r in rs])


def paired_ratio(runs, key_a, key_b, fn):
    """ours / torch per repeat (both present), then median and min-max."""
    a, b = runs.get(key_a, []), runs.get(key_b, [])
    return stat([fn(x) / fn(y) for x, y in zip(a, b) if "error" not in x and "error" not in y and fn(y)])


def fmt(s, spec="{:.2f}", unit=""):
    if s is None:
        return "-"
    f = lambda v: spec.format(v)   # noqa: E731
    if len(s["values"]) == 1:
        return f"{f(s['median'])}{unit}"
    return f"{f(s['median'])}{unit} [{f(s['min'])}-{f(s['max'])}]"


def error_of(runs, *keys):
    for k in keys:
        for r in runs.get(k, []):
            if "error" in r:
                return f"{k}: {r['error']}"
    return None


def summarise(runs, folder_info, scratch):
    """The table rows: [(label, ours, torch, ratio, target, verdict)] and a dict for the JSON."""
    table, summary = [], {}

    def add(label, ours=None, theirs=None, ratio=None, target="", verdict="", spec="{:.2f}", unit="", key=None):
        table.append((label, fmt(ours, spec, unit), fmt(theirs, spec, unit), fmt(ratio, "{:.2f}", "x"), target,
                      verdict))
        summary[key or label] = {"ours": ours, "torch": theirs, "ratio": ratio, "target": target, "met": verdict}

    def met(value, ok):
        return "" if value is None else ("yes" if ok(value["median"]) else "NO")

    if "load/ours" in runs:
        secs = lambda r: r["seconds"]                                          # noqa: E731
        rate = lambda r: r["folder_bytes"] / 1e6 / r["seconds"]                # noqa: E731
        over = lambda r: r["peak"] / r["held"]                                 # noqa: E731
        s_o, s_t = field(runs, "load/ours", "", secs), field(runs, "load/torch", "", secs)
        add("load seconds", s_o, s_t, paired_ratio(runs, "load/ours", "load/torch", secs))
        m_o, m_t = field(runs, "load/ours", "", rate), field(runs, "load/torch", "", rate)
        add("load MB/s (folder bytes)", m_o, m_t, paired_ratio(runs, "load/ours", "load/torch", rate),
            f">= {TARGETS['load_mb_s']:.0f} MB/s", met(m_o, lambda v: v >= TARGETS["load_mb_s"]), spec="{:.0f}")
        p_o, p_t = field(runs, "load/ours", "", over), field(runs, "load/torch", "", over)
        add("load peak / held", p_o, p_t, None, f"<= {TARGETS['load_peak_over_held']}x",
            met(p_o, lambda v: v <= TARGETS["load_peak_over_held"]))
        add("load peak MB (over imports)", field(runs, "load/ours", "", lambda r: r["peak"] / 1e6),
            field(runs, "load/torch", "", lambda r: r["peak"] / 1e6), spec="{:.0f}")
        add("load held MB", field(runs, "load/ours", "", lambda r: r["held"] / 1e6),
            field(runs, "load/torch", "", lambda r: r["held"] / 1e6), spec="{:.0f}")
    for n in (64, 512):
        name = f"fwd{n}"
        if f"{name}/pynative" not in runs:
            continue
        steady = lambda r: r["steady"]                                         # noqa: E731
        o_p, o_j, t = (field(runs, f"{name}/{m}", "steady") for m in ("pynative", "jit", "torch"))
        r_p = paired_ratio(runs, f"{name}/pynative", f"{name}/torch", steady)
        add(f"forward (1, {n}) PyNative s", o_p, t, r_p, f"<= {TARGETS['fwd_pynative']:.0f}x",
            met(r_p, lambda v: v <= TARGETS["fwd_pynative"]), spec="{:.3f}")
        add(f"forward (1, {n}) jit steady s", o_j, t, paired_ratio(runs, f"{name}/jit", f"{name}/torch", steady),
            spec="{:.3f}")
        add(f"forward (1, {n}) jit compile s", field(runs, f"{name}/jit", "compile"), None)
        add(f"forward (1, {n}) first call s", field(runs, f"{name}/pynative", "first"),
            field(runs, f"{name}/torch", "first"), spec="{:.3f}")
        summary[f"{name} built"] = sorted({r["how"] for k in ("pynative", "jit") for r in ok_runs(runs, f"{name}/{k}")})
        summary[f"{name} logits"] = compare_logits(scratch, name)
    if "train/pynative" in runs:
        steady = lambda r: r["steady"]                                         # noqa: E731
        t = field(runs, "train/torch", "steady")
        add("train step PyNative s", field(runs, "train/pynative", "steady"), t,
            paired_ratio(runs, "train/pynative", "train/torch", steady), spec="{:.3f}")
        r_j = paired_ratio(runs, "train/jit", "train/torch", steady)
        add("train step jit s", field(runs, "train/jit", "steady"), t, r_j, f"<= {TARGETS['train_jit']}x",
            met(r_j, lambda v: v <= TARGETS["train_jit"]), spec="{:.3f}")
        add("train step jit compile s", field(runs, "train/jit", "compile"), None)
        for mode in ("pynative", "jit"):
            add(f"train peak RSS / analytic ({mode})", field(runs, f"train/{mode}", "", lambda r: r["peak_rss"] /
                                                             r["analytic"]),
                field(runs, "train/torch", "", lambda r: r["peak_rss"] / r["analytic"]))
        add("train peak RSS MB (jit)", field(runs, "train/jit", "", lambda r: r["peak_rss"] / 1e6),
            field(runs, "train/torch", "", lambda r: r["peak_rss"] / 1e6), spec="{:.0f}")
        add("train analytic MB (4 x params x 4 B)", field(runs, "train/jit", "", lambda r: r["analytic"] / 1e6),
            field(runs, "train/torch", "", lambda r: r["analytic"] / 1e6), spec="{:.0f}")
        summary["train built"] = sorted({r["how"] for k in ("pynative", "jit") for r in ok_runs(runs, f"train/{k}")})
        summary["train first losses"] = {k: (ok_runs(runs, f"train/{k}") or [{}])[0].get("losses")
                                         for k in ("pynative", "jit", "torch")}
    for mode in ("jit", "pynative"):
        key = f"tp2/{mode}"
        if key not in runs:
            continue
        label = "PyNative" if mode == "pynative" else "jit"
        rs = ok_runs(runs, key)
        if not rs:
            reason = error_of(runs, key)
            table.append((f"train step tp2 {label} (trainer)", f"not measured: {reason}", "", "", "", ""))
            summary[f"train step tp2 {label} (trainer)"] = {"not measured": reason}
            continue
        one = runs.get(f"train/{mode}", [])
        ratio = stat([x["steady"] / y["steady"] for x, y in zip(runs[key], one)
                      if "error" not in x and "error" not in y]) if one else None
        add(f"train step tp2 {label} s (trainer, rank 0)", field(runs, key, "steady"),
            field(runs, "train/torch", "steady"), paired_ratio(runs, key, "train/torch", lambda r: r["steady"]),
            spec="{:.3f}")
        add(f"  tp2 / our one-process {label} step", ratio, None)
        add(f"  tp2 {label} first step - steady s", field(runs, key, "compile"), None)
        add(f"  tp2 {label} peak RSS MB (max rank)", field(runs, key, "", lambda r: max(r["peak_rss"].values()) / 1e6),
            None, spec="{:.0f}")
    for b in (1, 4):
        name = f"gen{b}"
        if f"{name}/ours" not in runs:
            continue
        add(f"generate {b} prompt(s): compile s", field(runs, f"{name}/ours", "compile"), None)
        ft = field(runs, f"{name}/ours", "prefill_seconds")
        add(f"generate {b}: first token s", ft, field(runs, f"{name}/torch", "first_token"),
            paired_ratio(runs, f"{name}/ours", f"{name}/torch", lambda r: r.get("prefill_seconds") or r["first_token"]),
            f"< {TARGETS['first_token_s']:.0f} s", met(ft, lambda v: v < TARGETS["first_token_s"]), spec="{:.3f}")
        add(f"generate {b}: prefill tokens/s", field(runs, f"{name}/ours", "prefill_tokens_per_s"),
            field(runs, f"{name}/torch", "prefill_tokens_per_s"),
            paired_ratio(runs, f"{name}/ours", f"{name}/torch", lambda r: r["prefill_tokens_per_s"]), spec="{:.0f}")
        r_d = paired_ratio(runs, f"{name}/ours", f"{name}/torch", lambda r: r["decode_tokens_per_s"])
        add(f"generate {b}: decode tokens/s", field(runs, f"{name}/ours", "decode_tokens_per_s"),
            field(runs, f"{name}/torch", "decode_tokens_per_s"), r_d, f">= {TARGETS['decode']}x",
            met(r_d, lambda v: v >= TARGETS["decode"]), spec="{:.1f}")
        summary[f"{name} built"] = sorted({r["how"] for r in ok_runs(runs, f"{name}/ours")})
        if b == 1:
            summary["gen1 greedy ids"] = compare_ids(runs)
    for n in (64, 256):
        name = f"matmul{n}"
        if f"{name}/mindspore" not in runs:
            continue
        secs = lambda r: r["seconds"]                                          # noqa: E731
        ms_s, t_s, np_s = (field(runs, f"{name}/{k}", "seconds") for k in ("mindspore", "torch", "numpy"))
        add(f"matmuls alone, {n} tokens s (MindSpore / torch)", ms_s, t_s,
            paired_ratio(runs, f"{name}/mindspore", f"{name}/torch", secs), spec="{:.3f}")
        add(f"matmuls alone, {n} tokens s (NumPy in 'torch')", ms_s, np_s,
            paired_ratio(runs, f"{name}/mindspore", f"{name}/numpy", secs), spec="{:.3f}")
        add(f"matmuls alone, {n} tokens GFLOP/s", field(runs, f"{name}/mindspore", "gflops"),
            field(runs, f"{name}/torch", "gflops"), spec="{:.0f}")
    return table, summary


def compare_logits(scratch, name):
    """Max |ours - transformers'| over the last position's logits (repeat 1) relative to transformers' largest."""
    import numpy as np
    paths = {k: os.path.join(scratch, f"{name}_{k}.npy") for k in ("pynative", "jit", "torch")}
    if not os.path.exists(paths["torch"]):
        return None
    ref = np.load(paths["torch"])
    out = {}
    for k in ("pynative", "jit"):
        if os.path.exists(paths[k]):
            out[k] = float(np.abs(np.load(paths[k]) - ref).max() / np.abs(ref).max())
    return out


def compare_ids(runs):
    ours = [r["ids"] for r in ok_runs(runs, "gen1/ours")]
    theirs = [r["ids"] for r in ok_runs(runs, "gen1/torch")]
    if not ours or not theirs:
        return None
    a, b = ours[0][0], theirs[0][0]
    first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
    return {"equal": a == b, "first_difference": first, "ours": a, "torch": b,
            "same_every_repeat": all(o == ours[0] for o in ours) and all(t == theirs[0] for t in theirs)}


def print_table(table, header):
    print(header)
    shown = [row for row in table if not row[1].startswith("not measured")]
    widths = [max(len(str(row[i])) for row in shown + [("row", "ours", "torch", "ours/torch", "target", "met")])
              for i in range(6)]
    widths[0] = max(widths[0], 10)
    line = lambda row: "  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip()   # noqa: E731
    print(line(("row", "ours", "torch", "ours/torch", "target", "met")))
    print("-" * (sum(widths) + 10))
    for row in table:
        if row[1].startswith("not measured"):
            print(f"{row[0].ljust(widths[0])}  {row[1]}")
        else:
            print(line(row))


def sweep_summary(runs, layers):
    out, lines = {}, []
    for what in ("forward", "train", "generate"):
        vals = {L: field(runs, f"{what}/L{L}", "compile") for L in layers}
        steady = {L: field(runs, f"{what}/L{L}", "steady") for L in layers}
        first, last = vals[layers[0]], vals[layers[-1]]
        ratio = stat([x["compile"] / y["compile"] for x, y in zip(runs[f"{what}/L{layers[-1]}"],
                                                                   runs[f"{what}/L{layers[0]}"])
                      if "error" not in x and "error" not in y and y["compile"] > 0]) if first and last else None
        verdict = "" if ratio is None else ("yes" if ratio["median"] <= TARGETS["compile_depth"] else "NO")
        out[what] = {"compile": {L: vals[L] for L in layers}, "steady": {L: steady[L] for L in layers},
                     "ratio_last_first": ratio, "met": verdict,
                     "errors": [error_of(runs, f"{what}/L{L}") for L in layers if error_of(runs, f"{what}/L{L}")]}
        lines.append((what, [fmt(vals[L], "{:.1f}") for L in layers], [fmt(steady[L], "{:.3f}") for L in layers],
                      fmt(ratio, "{:.2f}", "x"), verdict))
    head = "compile s by layers: " + ", ".join(f"L={L}" for L in layers)
    print(head)
    for what, comp, steady, ratio, verdict in lines:
        print(f"  {what:<9} compile " + " | ".join(f"L{L} {c}" for L, c in zip(layers, comp))
              + f"   steady " + " | ".join(f"L{L} {s}" for L, s in zip(layers, steady))
              + f"   L{layers[-1]}/L{layers[0]} {ratio} (target <= {TARGETS['compile_depth']}x) {verdict}")
    for what, v in out.items():
        for e in v["errors"]:
            print(f"  {what}: not measured: {e}")
    return out


# ---- the folder -------------------------------------------------------------------------------------------
def torch_python(given):
    """--peer-python, else $MFC_TORCH_PYTHON: an interpreter where torch and transformers import (None: none)."""
    for py in (given, os.environ.get("MFC_TORCH_PYTHON")):
        if py and subprocess.run([py, "-c", "import torch, transformers"], capture_output=True).returncode == 0:
            return py
    return None


def folder_layers(folder):
    with open(os.path.join(folder, "config.json")) as f:
        return json.load(f)["num_hidden_layers"]


def make_folder(python, out, layers):
    proc = subprocess.run([python, FOLDER_SCRIPT, out, "--layers", str(layers)], cwd=ROOT, capture_output=True,
                          text=True, env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    if proc.returncode:
        raise SystemExit(f"bench/real_size_folder.py failed:\n{(proc.stdout + proc.stderr)[-3000:]}")


def write_config_only(out, layers):
    """config.json alone (the compile sweep reads nothing else): Qwen3-0.6B's, as real_size_folder.py writes it."""
    from bench.real_size_folder import QWEN3_06B
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(dict(QWEN3_06B, num_hidden_layers=layers, max_window_layers=layers), f, indent=2)


def cores():
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--folder", default=None, help="an existing Qwen3-shaped Hugging Face folder (else one is made)")
    ap.add_argument("--layers", type=int, default=None,
                    help="make a folder of this many layers (default 28; with --folder: must match it)")
    ap.add_argument("--peer-python", default=None,
                    help="interpreter with torch + transformers (default $MFC_TORCH_PYTHON): the torch rows and "
                         "making the folder")
    ap.add_argument("--rows", default=",".join(ROWS), help=f"comma-separated, of {','.join(ROWS)}")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--calls", type=int, default=3, help="forward calls after the first (steady = their median)")
    ap.add_argument("--steps", type=int, default=4, help="training steps per process (the first compiles)")
    ap.add_argument("--warmup", type=int, default=0, help="steps after the first also left out of the median")
    ap.add_argument("--gen-runs", type=int, default=3, help="generates per process (the first compiles)")
    ap.add_argument("--matmul-passes", type=int, default=3, help="passes over the matmuls (the first warms up)")
    ap.add_argument("--threads", type=int, default=cores(), help="kernel threads, ours and torch's (default: cores)")
    ap.add_argument("--timeout", type=float, default=3600, help="seconds per measurement")
    ap.add_argument("--tp2-modes", default="jit", help="modes of the tp2 row: jit, pynative or jit,pynative")
    ap.add_argument("--train-modes", default="pynative,jit",
                    help="modes of our train row (at 28 layers the jit step needs more than this machine's 24 GB: "
                         "docs/performance.md)")
    ap.add_argument("--compile-sweep", action="store_true", help="compile seconds against depth instead")
    ap.add_argument("--sweep-layers", default="2,8,28")
    ap.add_argument("--json", default=None, help="write every repeat's numbers, medians and min-max here")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory (a folder made here, logits)")
    a = ap.parse_args(argv)
    a.rows = [r.strip() for r in a.rows.split(",") if r.strip()]
    bad = [r for r in a.rows if r not in ROWS]
    if bad:
        ap.error(f"--rows: {', '.join(bad)} unknown; valid: {', '.join(ROWS)}")
    a.sweep_layers = [int(x) for x in a.sweep_layers.split(",")]
    a.tp2_modes = [m.strip() for m in a.tp2_modes.split(",") if m.strip()]
    a.train_modes = [m.strip() for m in a.train_modes.split(",") if m.strip()]
    if not a.train_modes or any(m not in ("jit", "pynative") for m in a.train_modes):
        ap.error(f"--train-modes {','.join(a.train_modes)!r}: jit, pynative or both (comma-separated)")
    if not a.tp2_modes or any(m not in ("jit", "pynative") for m in a.tp2_modes):
        ap.error(f"--tp2-modes {','.join(a.tp2_modes)!r}: jit, pynative or both (comma-separated)")
    if a.repeats < 1 or a.steps < 2 + a.warmup or a.calls < 1 or a.gen_runs < 2 or a.matmul_passes < 1:
        ap.error("--repeats >= 1, --steps >= 2 + --warmup, --calls >= 1, --gen-runs >= 2, --matmul-passes >= 1")
    peer = torch_python(a.peer_python)
    scratch = tempfile.mkdtemp(prefix="real_size_")
    folder = a.folder
    if folder:
        if not os.path.isfile(os.path.join(folder, "config.json")):
            ap.error(f"--folder {folder}: no config.json there")
        if a.layers is not None and folder_layers(folder) != a.layers:
            ap.error(f"--layers {a.layers}: the folder {folder} has {folder_layers(folder)} layers; drop --layers "
                     "or --folder (without --folder one of --layers layers is made)")
    elif a.compile_sweep:
        folder = os.path.join(scratch, "config_only")
        write_config_only(folder, a.layers or 28)
    else:
        if peer is None:
            raise SystemExit("bench/real_size.py: no --folder and no interpreter with torch + transformers to make one "
                             "(--peer-python /path/to/torch-venv/bin/python, or $MFC_TORCH_PYTHON)")
        folder = os.path.join(scratch, "qwen3_shape")
        t0 = time.monotonic()
        make_folder(peer, folder, a.layers or 28)
        print(f"# made {folder} ({a.layers or 28} layers) in {time.monotonic() - t0:.0f} s", flush=True)
    with open(os.path.join(folder, "config.json")) as f:
        config = json.load(f)
    size = sum(os.path.getsize(os.path.join(folder, n)) for n in os.listdir(folder) if n.endswith(".safetensors"))
    info = {"folder": folder, "layers": config["num_hidden_layers"], "folder_bytes": size,
            "dtype": config.get("dtype") or config.get("torch_dtype"), "threads": a.threads,
            "peer_python": peer, "uptime_before": uptime()}
    started = time.time()
    if a.compile_sweep:
        jobs = sweep_plan(a, folder)
        runs = measure(jobs, a, a.repeats, peer, folder, scratch)
        print()
        print(f"compile sweep: random-weight models from {folder}/config.json, layers {a.sweep_layers}; medians of "
              f"{a.repeats} interleaved repeats [min-max], a fresh process each; {a.threads} kernel threads")
        result = {"mode": "compile_sweep", "info": info, "args": vars(a), "runs": runs,
                  "summary": sweep_summary(runs, a.sweep_layers)}
    else:
        jobs = plan(a, folder, config["vocab_size"])
        if peer is None:
            print("# no --peer-python: the torch rows are not measured", flush=True)
        runs = measure(jobs, a, a.repeats, peer, folder, scratch)
        table, summary = summarise(runs, info, scratch)
        print()
        header = (f"{folder}: {config['num_hidden_layers']} layers, {size / 1e9:.2f} GB of safetensors "
                  f"({info['dtype']}); medians of {a.repeats} interleaved repeats [min-max], a fresh process each; "
                  f"{a.threads} kernel threads (ours and torch's); ratio = ours / torch, paired by repeat")
        print_table(table, header)
        for key in ("fwd64 built", "fwd512 built", "train built", "gen1 built", "gen4 built"):
            if summary.get(key):
                print(f"{key}: {'; '.join(summary[key])}")
        for key in ("fwd64 logits", "fwd512 logits"):
            if summary.get(key):
                print(f"{key}: max |ours - transformers'| / max |transformers'| of the last position: "
                      + ", ".join(f"{k} {v:.1e}" for k, v in summary[key].items()))
        ids = summary.get("gen1 greedy ids")
        if ids:
            print(f"gen1 greedy ids equal to transformers': {ids['equal']}"
                  + ("" if ids["equal"] else f" (first difference at new token {ids['first_difference']})"))
        share(summary)
        for key, rs in runs.items():
            for r in rs:
                if "error" in r:
                    print(f"not measured: {key}: {r['error']}")
        result = {"mode": "rows", "info": info, "args": vars(a), "runs": runs, "summary": summary}
    info["uptime_after"], info["wall_s"] = uptime(), time.time() - started
    if a.json:
        os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1, default=str)
        print(f"wrote {a.json}")
    if a.keep:
        print(f"kept {scratch}")
    else:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


def share(summary):
    """The matmuls' share of the forward: plain MindSpore's (64 tokens) against our jit forward, torch's against
    transformers' forward."""
    mm, fwd = summary.get("matmuls alone, 64 tokens s (MindSpore / torch)"), summary.get("forward (1, 64) jit steady s")
    if not mm or not fwd or not mm["ours"] or not fwd["ours"]:
        return
    line = (f"matmuls' share of the (1, 64) forward: MindSpore's alone {mm['ours']['median']:.3f} s of our jit "
            f"{fwd['ours']['median']:.3f} s ({mm['ours']['median'] / fwd['ours']['median']:.0%})")
    pyn = summary.get("forward (1, 64) PyNative s")
    if pyn and pyn["ours"]:
        line += f", of our PyNative {pyn['ours']['median']:.3f} s ({mm['ours']['median'] / pyn['ours']['median']:.0%})"
    if mm["torch"] and fwd["torch"]:
        line += (f"; torch's alone {mm['torch']['median']:.3f} s of transformers' {fwd['torch']['median']:.3f} s "
                 f"({mm['torch']['median'] / fwd['torch']['median']:.0%})")
    print(line)


def uptime():
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    except OSError:
        return f"load average {os.getloadavg()}"


if __name__ == "__main__":
    sys.exit(main())
