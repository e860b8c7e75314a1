"""`make demo`: train the tiny Llama from configs/llama_tiny.yaml end to end on CPU.

1. one process (PyNative), through run_mindformer.py;
2. the same YAML on 4 msrun workers, data_parallel 2 x model_parallel 2 (tensor parallel from
   the layers' shard() declarations), through scripts/msrun_launcher.sh.
Both runs see the same global batches (each dp rank reads its slice of the same shuffled order),
so the two loss curves should agree to float precision; the table prints both.
"""
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = int(os.environ.get("DEMO_STEPS", "20"))
OUT = os.path.join(ROOT, "output", "demo")


def losses(path):
    with open(path) as f:
        return [json.loads(line)["loss"] for line in f]


def main() -> int:
    env = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""),
               PYTHONPATH=ROOT)
    common = ["--config", "configs/llama_tiny.yaml", "--runner_config.max_steps", str(STEPS),
              "--lr_schedule.total_steps", str(STEPS)]
    single, parallel = os.path.join(OUT, "single"), os.path.join(OUT, "dp2_tp2")
    for d in (single, parallel):
        subprocess.run(["rm", "-rf", d], check=True)
    t0 = time.monotonic()
    print(f"== 1 process: {STEPS} steps of the tiny Llama (builds the corpus and tokenizer first)", flush=True)
    subprocess.run([sys.executable, "run_mindformer.py", *common, "--output_dir", single], cwd=ROOT, env=env,
                   check=True)
    t1 = time.monotonic()
    # reuse the tokenizer and corpus the first run built, so both runs read identical data
    tok = os.path.join(single, "tokenizer_1024.model")
    corpus = os.path.join(single, "corpus.txt")
    cmd = " ".join(["run_mindformer.py", *common, "--output_dir", parallel, "--use_parallel", "True",
                    "--parallel_config.data_parallel", "2", "--parallel_config.model_parallel", "2",
                    "--runner_config.batch_size", "2", "--train_dataset.tokenizer_file", tok,
                    "--train_dataset.dataset_dir", corpus])
    print(f"\n== 4 msrun workers (dp2 x tp2): bash scripts/msrun_launcher.sh \"{cmd}\" 4", flush=True)
    log_dir = os.path.join(parallel, "msrun_log")
    port = str(__import__("mindformers_core.testing", fromlist=["free_port"]).free_port())
    subprocess.run(["bash", "scripts/msrun_launcher.sh", cmd, "4", port, log_dir, "True", "600"], cwd=ROOT,
                   env=env, check=True)
    t2 = time.monotonic()
    a, b = losses(os.path.join(single, "loss.jsonl")), losses(os.path.join(parallel, "loss.jsonl"))
    print(f"\n{'step':>4} {'1 process':>10} {'dp2 x tp2':>10} {'rel diff':>9}")
    worst = 0.0
    for i, (x, y) in enumerate(zip(a, b), 1):
        rel = abs(x - y) / abs(x)
        worst = max(worst, rel)
        print(f"{i:>4} {x:>10.5f} {y:>10.5f} {rel:>9.1e}")
    print(f"\nloss {a[0]:.3f} -> {a[-1]:.3f}; worst relative difference {worst:.1e}; "
          f"1 process {t1 - t0:.0f}s, 4 workers {t2 - t1:.0f}s")
    curves = [os.path.join(d, "loss.svg") for d in (single, parallel)]
    print("loss curves (open in a browser): " + ", ".join(os.path.relpath(c, ROOT) for c in curves))
    ok = len(a) == len(b) == STEPS and a[-1] < a[0] and worst < 1e-3 and all(map(os.path.exists, curves))
    print("demo OK" if ok else "demo FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
