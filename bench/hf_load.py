"""Peak memory of loading a Hugging Face folder by slice: one process vs one rank of tp2 / tp4.

A synthetic Llama folder (random weights, default ~380 MB fp32: hidden 1024, 4 layers, FFN 4096, vocab 16000)
is written once; then, in a fresh subprocess per measurement (interleaved repeats), ``load_hf_weights`` reads
what one rank holds -- everything (one process), or rank 0's column/row/vocab slices at tp2 and tp4 -- and the
growth of the process's peak RSS (VmHWM) over the load is recorded. Slicing shows as a peak near the rank's
shard, not the whole model.

    python bench/hf_load.py [--repeats 3] [--hidden 1024 --layers 4 --ffn 4096 --vocab 16000] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

CHILD = r"""
import json, re, sys, time
def hwm():
    return int(re.search(r"VmHWM:\s+(\d+) kB", open("/proc/self/status").read()).group(1)) * 1024
from mindformers_core.models.hf.folder import open_folder
from mindformers_core.models.hf.loader import load_hf_weights
from mindformers_core.models.llama.hf import LLAMA_HF
from mindformers_core.sharding.layout import Layout
folder, tp, rank = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
hf = open_folder(folder)
mesh = Layout((tp,), ("tp",))
COLUMN = ("linear_q", "linear_k", "linear_v", "linear_fc1_gate", "linear_fc1_up", "output_layer")
ROW = ("linear_proj", "linear_fc2", "word_embeddings")
targets = {}
for name, info in hf.tensors.items():
    ours = LLAMA_HF.ours_of_hf(name)
    shape = tuple(info.shape[::-1]) if len(info.shape) == 2 and "embed" not in name else tuple(info.shape)
    layout = None
    if tp > 1 and any(k in ours for k in COLUMN):
        layout = mesh("None", "tp")
    elif tp > 1 and any(k in ours for k in ROW):
        layout = mesh("tp", "None")
    targets[ours] = (shape, layout)
before = hwm()
t0 = time.monotonic()
values = load_hf_weights(hf, LLAMA_HF, targets, rank)
seconds = time.monotonic() - t0
held = sum(v.nbytes for v in values.values())
print(json.dumps({"peak_growth": hwm() - before, "held": held, "seconds": seconds}))
"""


def make_folder(path: str, hidden: int, layers: int, ffn: int, vocab: int, heads: int = 16) -> None:
    import numpy as np
    from mindformers_core.models.hf.export import export_folder
    from mindformers_core.models.llama.hf import LLAMA_HF
    rng = np.random.default_rng(0)

    def w(*shape):
        return rng.standard_normal(shape, dtype=np.float32) * 0.02

    state = {"embedding.word_embeddings.weight": w(vocab, hidden), "decoder.final_layernorm.weight": np.ones(hidden,
             np.float32), "output_layer.weight": w(hidden, vocab)}
    for i in range(layers):
        p = f"decoder.layers.{i}."
        state.update({p + "input_layernorm.weight": np.ones(hidden, np.float32),
                      p + "pre_mlp_layernorm.weight": np.ones(hidden, np.float32),
                      p + "self_attention.linear_q.weight": w(hidden, hidden),
                      p + "self_attention.linear_k.weight": w(hidden, hidden),
                      p + "self_attention.linear_v.weight": w(hidden, hidden),
                      p + "self_attention.linear_proj.weight": w(hidden, hidden),
                      p + "mlp.linear_fc1_gate.weight": w(hidden, ffn), p + "mlp.linear_fc1_up.weight": w(hidden, ffn),
                      p + "mlp.linear_fc2.weight": w(ffn, hidden)})
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": hidden,
              "num_hidden_layers": layers, "intermediate_size": ffn, "vocab_size": vocab,
              "num_attention_heads": heads, "num_key_value_heads": heads}
    export_folder(path, state, LLAMA_HF, config, max_shard_bytes=100 * 1024 ** 2)


def measure(folder: str, tp: int, rank: int) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, folder, str(tp), str(rank)], capture_output=True, text=True,
                         cwd=ROOT, timeout=600)
    if out.returncode:
        raise RuntimeError(out.stderr[-2000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--ffn", type=int, default=4096)
    ap.add_argument("--vocab", type=int, default=16000)
    ap.add_argument("--json", default=None, help="write the results here")
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="hf_load_") as tmp:
        folder = os.path.join(tmp, "llama")
        make_folder(folder, a.hidden, a.layers, a.ffn, a.vocab)
        size = sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder))
        rows = {"1 process": (1, 0), "tp2 rank 0": (2, 0), "tp4 rank 0": (4, 0)}
        runs = {k: [] for k in rows}
        for _ in range(a.repeats):                      # interleaved
            for name, (tp, rank) in rows.items():
                runs[name].append(measure(folder, tp, rank))
    base = statistics.median(r["peak_growth"] for r in runs["1 process"])
    print(f"folder: {size / 1e6:.0f} MB of fp32 safetensors; medians of {a.repeats} interleaved repeats [min-max]")
    print(f"{'load':<12} {'held MB':>8} {'peak RSS growth MB':>28} {'vs 1 process':>13} {'seconds':>16}")
    result = {"folder_bytes": size, "repeats": a.repeats, "rows": {}}
    for name, rs in runs.items():
        peaks = [r["peak_growth"] / 1e6 for r in rs]
        secs = [r["seconds"] for r in rs]
        med = statistics.median(r["peak_growth"] for r in rs)
        print(f"{name:<12} {rs[0]['held'] / 1e6:>8.0f} {statistics.median(peaks):>10.0f} [{min(peaks):.0f}-"
              f"{max(peaks):.0f}]{'':>6} {med / base:>12.2f}x {statistics.median(secs):>7.2f} "
              f"[{min(secs):.2f}-{max(secs):.2f}]")
        result["rows"][name] = {"held_bytes": rs[0]["held"], "peak_growth_bytes": [r["peak_growth"] for r in rs],
                                "seconds": secs, "ratio_to_one_process": med / base}
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
