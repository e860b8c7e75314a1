"""Checkpoint saving cost, synchronous vs asynchronous, and kills during asynchronous saves.

1. Step cost of saving (research/llama/llama_100m.yaml's 12 layers x 768 with a 8192-piece
   tokenizer trained on the built-in corpus, ~98M parameters, 1.2 GB of weights + AdamW moments per
   save; one 256-token row per step so that a step takes seconds on 2 shared cores — the save's size
   does not depend on the batch; PyNative, one process): the trainer runs ``--steps`` steps with no saving,
   with a synchronous save every ``--every`` steps, and with ``async_save: True``. The bench
   timestamps each step's console line as it arrives; the interval after a saving step holds that
   save's cost on the loop (sync: the whole write; async: the host copies). Repeated ``--repeats``
   times, configurations interleaved so machine load falls on all alike; medians reported.
2. Kills (``--kills`` times, a ~25M-parameter variant, async save every step): the job is SIGKILLed
   at a random moment while a save is being written (its staging directory exists); then the
   tracker's step must verify (metadata, tiling, headers, SHA-256 of every file) and load.

Prints a table and writes bench/results/checkpoint.json.

    python bench/checkpoint.py [--steps 8] [--every 2] [--repeats 3] [--kills 10]
"""
import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
CONFIG = os.path.join(ROOT, "research", "llama", "llama_100m.yaml")
VOCAB = 8192
SMALL = ["--model.model_config.num_layers", "6", "--model.model_config.hidden_size", "512",
         "--model.model_config.ffn_hidden_size", "1408", "--model.model_config.num_heads", "8",
         "--model.model_config.seq_length", "256"]


def run(out, steps, callbacks, extra=(), on_line=None, popen=False):
    tok = os.path.join(os.path.dirname(out), "assets", f"tokenizer_{VOCAB}.model")
    corpus = os.path.join(os.path.dirname(out), "assets", "corpus.txt")
    cmd = [sys.executable, "run_mindformer.py", "--config", CONFIG, "--output_dir", out, "--overwrite_output_dir",
           "True", "--model.model_config.vocab_size", str(VOCAB), "--runner_config.max_steps", str(steps),
           "--lr_schedule.total_steps", str(steps), "--lr_schedule.warmup_steps", "1",
           "--train_dataset.tokenizer_file", tok, "--train_dataset.dataset_dir", corpus, "--callbacks", callbacks,
           *extra]
    env = dict(os.environ, PYTHONPATH=ROOT, GLOG_v="3")
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    if popen:
        return proc
    stamps, lines = {}, []
    for line in proc.stdout:
        lines.append(line)
        if line.startswith("step ") and "/" in line.split()[1]:
            stamps[int(line.split()[1].split("/")[0])] = time.monotonic()
        if on_line:
            on_line(line)
    if proc.wait() != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}:\n{''.join(lines[-20:])}")
    return stamps


def assets(base):
    """The corpus and an 8192-piece tokenizer, built once (the first, 1-step run writes them)."""
    a = os.path.join(base, "assets")
    if not os.path.exists(os.path.join(a, f"tokenizer_{VOCAB}.model")):
        os.makedirs(a, exist_ok=True)
        from mindformers_core.data.corpus import build_corpus
        from mindformers_core.data.tokenizer import train_tokenizer
        corpus = build_corpus(os.path.join(a, "corpus.txt"), max_bytes=2_000_000)
        trained = train_tokenizer([corpus], os.path.join(a, f"tokenizer_{VOCAB}"), VOCAB)
        assert os.path.basename(trained) == f"tokenizer_{VOCAB}.model", trained


def callbacks(every, asynchronous):
    if not every:
        return "[{type: MFLossMonitor}]"
    return (f"[{{type: MFLossMonitor}}, {{type: CheckpointMonitor, save_checkpoint_steps: {every}, "
            f"keep_checkpoint_max: 2, async_save: {asynchronous}}}]")


TIMING = ["--runner_config.batch_size", "1", "--model.model_config.seq_length", "256"]


def save_cost(base, steps, every, repeats):
    rows = {"none": [], "sync": [], "async": []}
    for r in range(repeats):
        for name, cb in (("none", callbacks(0, False)), ("sync", callbacks(every, False)),
                         ("async", callbacks(every, True))):
            stamps = run(os.path.join(base, f"{name}_{r}"), steps, cb, TIMING)
            # interval ending at step k+1: step k+1's work + (saving) the save of step k
            gaps = {k + 1: stamps[k + 1] - stamps[k] for k in range(2, steps)}    # after warm-up (steps 1-2)
            after_save = [g for k, g in gaps.items() if every and (k - 1) % every == 0]
            plain = [g for k, g in gaps.items() if not every or (k - 1) % every != 0]
            rows[name].append({"plain_step_s": statistics.median(plain),
                               "after_save_step_s": statistics.median(after_save) if after_save else None,
                               "gaps": gaps})
            print(f"  repeat {r + 1} {name:>5}: " + " ".join(f"{g:.2f}" for g in gaps.values()), flush=True)
    return rows


def kills(base, n):
    from mindformers_core.checkpoint import load_checkpoint, checkpoint_specs, read_tracker, verify_step
    results = []
    for i in range(n):
        out = os.path.join(base, f"kill_{i}")
        proc = run(out, 40, "[{type: MFLossMonitor}, {type: CheckpointMonitor, save_checkpoint_steps: 1, "
                            "keep_checkpoint_max: 2, async_save: True}]", SMALL, popen=True)
        ckpt = os.path.join(out, "checkpoint")
        target = random.randint(2, 4)
        deadline = time.monotonic() + 300
        while not os.path.isdir(os.path.join(ckpt, f"step_{target}.tmp")):
            if proc.poll() is not None or time.monotonic() > deadline:
                break
            time.sleep(0.01)
        time.sleep(random.uniform(0.0, 0.3))
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        latest = read_tracker(ckpt)
        problems = verify_step(ckpt, latest) if latest is not None else ["no checkpoint"]
        loadable = False
        if not problems:
            values = load_checkpoint(ckpt, checkpoint_specs(ckpt, latest), step=latest)
            loadable = all(v.size for v in values.values())
        left = sorted(n for n in os.listdir(ckpt) if n.endswith(".tmp"))
        results.append({"killed_during": f"step_{target}.tmp", "latest": latest, "intact": not problems,
                        "loadable": loadable, "staging_left": left})
        print(f"  kill {i + 1}: during step_{target}.tmp -> latest step_{latest}, intact {not problems}, "
              f"loadable {loadable}", flush=True)
    return results


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=7)
    ap.add_argument("--every", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--kills", type=int, default=10)
    ap.add_argument("--base", default=os.path.join(ROOT, "output", "bench_checkpoint"))
    a = ap.parse_args()
    os.makedirs(a.base, exist_ok=True)
    assets(a.base)
    print(f"save cost: {a.steps} steps, save every {a.every}, {a.repeats} repeats (100M-class, PyNative)")
    rows = save_cost(a.base, a.steps, a.every, a.repeats)
    print(f"kills during async saves: {a.kills}")
    killed = kills(a.base, a.kills)
    plain = statistics.median(x["plain_step_s"] for v in rows.values() for x in v)
    print("\n| saving | median step (s) | median step after a save (s; 'none': the same positions, no save) | "
          "save cost on the loop (s) |")
    print("|---|---|---|---|")
    summary = {}
    for name, v in rows.items():
        after = [x["after_save_step_s"] for x in v if x["after_save_step_s"] is not None]
        own = statistics.median(x["plain_step_s"] for x in v)
        cost = statistics.median(after) - own if after else 0.0
        summary[name] = {"plain_step_s": own, "after_save_step_s": statistics.median(after) if after else None,
                         "save_cost_s": cost, "per_repeat": [{k: x[k] for k in x if k != "gaps"} for x in v]}
        print(f"| {name} | {own:.2f} | {summary[name]['after_save_step_s'] or 0:.2f} | {cost:.2f} |")
    ok = sum(k["intact"] and k["loadable"] for k in killed)
    print(f"\nkills during an async save: latest checkpoint intact and loadable {ok}/{len(killed)}")
    os.makedirs(os.path.join(ROOT, "bench", "results"), exist_ok=True)
    with open(os.path.join(ROOT, "bench", "results", "checkpoint.json"), "w") as f:
        json.dump({"steps": a.steps, "every": a.every, "repeats": a.repeats, "median_plain_step_s": plain,
                   "saving": summary, "kills": killed, "kills_ok": ok,
                   "gaps": {n: [x["gaps"] for x in v] for n, v in rows.items()}}, f, indent=1)


if __name__ == "__main__":
    main()
