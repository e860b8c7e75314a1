"""Loading a Hugging Face folder at real size: ``from_pretrained`` and the trainer's slice load, time and memory.

Rows, each measured in a fresh subprocess per repeat (repeats interleaved, so a slow moment of the shared machine
hits every row alike):

- ``from_pretrained``: ``from_pretrained(folder)`` -- the model built from config.json and every weight loaded
  (wall seconds of the call);
- ``trainer tp1`` / ``trainer tp2 rank 0``: the trainer's Hugging Face load (``Checkpointer.load`` on the folder,
  the ``pretrained_model_dir`` + ``load_checkpoint`` path of training/checkpointing.py) into Parameters of the
  rank's local shapes, annotated with tensor-parallel layouts as ``parallelize`` leaves them (q/k/v/gate/up split
  by columns, o/down by rows, the embedding by vocabulary rows; norms whole). The parameters are allocated
  before the clock starts, as the trainer's model is built before it loads.

Per row: seconds, MB/s (bytes of the folder's tensors the rank reads / seconds), ``held`` (the bytes the
parameters hold: what the rank needs), ``peak`` (the process's VmHWM at the end minus its VmRSS after the imports,
before anything was built: what building + loading cost at most) and peak / held. Per-layer constant tables a
model builds (rotary, masks) count in the peak, not in ``held``.

    python bench/hf_load.py --folder /work/qwen3_06b [--repeats 3] [--json out.json]
    python bench/hf_load.py            # a synthetic fp32 Llama folder (hidden 1024, 4 layers, vocab 16000)
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
def status(key):
    return int(re.search(key + r":\s+(\d+) kB", open("/proc/self/status").read()).group(1)) * 1024
import numpy as np
import mindspore as ms
from mindformers_core.models.hf.folder import DTYPES, open_folder
from mindformers_core.models.hf.config import read_hf_config
from mindformers_core.models.hf.pretrained import from_pretrained
mode, folder = sys.argv[1], sys.argv[2]
hf = open_folder(folder)
spec, _, _ = read_hf_config(folder)
adapter = spec.state_dict_adapter

def read_bytes(names_regions):
    total = 0
    for name, (shape, region) in names_regions.items():
        hf_name = next(iter(adapter.hf_shapes(name, shape)))
        info = hf.tensors.get(hf_name) or hf.tensors[adapter.fallbacks[hf_name]]
        total += int(np.prod([b - a for a, b in region])) * DTYPES[info.dtype][1] * len(adapter.hf_shapes(name, shape))
    return total

base = status("VmRSS")
if mode == "pretrained":
    t0 = time.monotonic()
    model = from_pretrained(folder)
    seconds = time.monotonic() - t0
    params = list(model.get_parameters())
    held = sum(p.nbytes for p in params)
    regions = {}
    for p in params:
        try:
            adapter.hf_shapes(p.name, tuple(p.shape))
        except KeyError:
            continue
        regions[p.name] = (tuple(p.shape), tuple((0, n) for n in p.shape))
    read = read_bytes(regions)
else:
    import tempfile
    from mindspore import Parameter, Tensor
    from mindformers_core.sharding.layout import Layout
    from mindformers_core.sharding.annotations import annotate_parameter
    from mindformers_core.training.checkpointing import Checkpointer
    tp, rank = int(sys.argv[3]), int(sys.argv[4])
    mesh = Layout((tp,), ("tp",))
    COLUMN = ("linear_q.", "linear_k.", "linear_v.", "linear_fc1_gate.", "linear_fc1_up.", "output_layer.")
    ROW = ("linear_proj.", "linear_fc2.", "word_embeddings.")
    params, regions = [], {}
    for name, info in hf.tensors.items():
        ours = adapter.ours_of_hf(name)
        if ours is None:
            continue
        shape = tuple(info.shape)
        if adapter.hf_shapes(ours, shape)[name] != shape:      # a transposed row
            shape = shape[::-1]
        layout = None
        if tp > 1 and len(shape) == 2 and any(k in ours for k in COLUMN):
            layout = mesh("None", "tp")
        elif tp > 1 and len(shape) == 2 and any(k in ours for k in ROW):
            layout = mesh("tp", "None")
        region = tuple((0, n) for n in shape) if layout is None else tuple(
            (s.start, s.stop) for s in layout.local_slice(shape, rank))
        p = Parameter(Tensor(np.zeros([b - a for a, b in region], np.float32)), name=ours)
        if layout is not None:
            annotate_parameter(p, layout, shape, ())
        params.append(p)
        regions[ours] = (shape, region)
    held = sum(p.nbytes for p in params)
    read = read_bytes(regions)
    with tempfile.TemporaryDirectory() as out:
        ckpt = Checkpointer(directory=out, rank=rank, world=tp, params=params, dp=1, dp_rank=0,
                            hf_adapter=adapter, log=lambda text: None)
        t0 = time.monotonic()
        ckpt.load(folder, resume=False)
        seconds = time.monotonic() - t0
print(json.dumps({"seconds": seconds, "held": held, "read": read, "peak": status("VmHWM") - base,
                  "base": base}))
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
              "num_attention_heads": heads, "num_key_value_heads": heads, "max_position_embeddings": 2048}
    export_folder(path, state, LLAMA_HF, config, max_shard_bytes=100 * 1024 ** 2)


def measure(args) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, *map(str, args)], capture_output=True, text=True,
                         cwd=ROOT, timeout=1800)
    if out.returncode:
        raise RuntimeError(out.stderr[-3000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def _span(values, fmt):
    return f"{fmt.format(statistics.median(values))} [{fmt.format(min(values))}-{fmt.format(max(values))}]"


def run(folder: str, repeats: int, rows) -> dict:
    size = sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder) if f.endswith(".safetensors"))
    runs = {k: [] for k in rows}
    for _ in range(repeats):                      # interleaved
        for name, args in rows.items():
            runs[name].append(measure([args[0], folder, *args[1:]]))
    print(f"folder {folder}: {size / 1e6:.0f} MB of safetensors; medians of {repeats} interleaved repeats "
          "[min-max], a fresh process each")
    print(f"{'load':<20} {'seconds':>20} {'MB/s':>16} {'read MB':>8} {'held MB':>8} {'peak MB':>20} "
          f"{'peak/held':>18}")
    result = {"folder": folder, "folder_bytes": size, "repeats": repeats, "rows": {}}
    for name, rs in runs.items():
        secs = [r["seconds"] for r in rs]
        rates = [r["read"] / 1e6 / r["seconds"] for r in rs]
        peaks = [r["peak"] / 1e6 for r in rs]
        ratios = [r["peak"] / r["held"] for r in rs]
        print(f"{name:<20} {_span(secs, '{:.2f}'):>20} {_span(rates, '{:.0f}'):>16} {rs[0]['read'] / 1e6:>8.0f} "
              f"{rs[0]['held'] / 1e6:>8.0f} {_span(peaks, '{:.0f}'):>20} {_span(ratios, '{:.2f}'):>18}")
        result["rows"][name] = {
            "read_bytes": rs[0]["read"], "held_bytes": rs[0]["held"], "seconds": secs, "mb_per_s": rates,
            "peak_bytes": [r["peak"] for r in rs], "peak_over_held": ratios, "base_rss_bytes": [r["base"] for r in rs],
            "median": {"seconds": statistics.median(secs), "mb_per_s": statistics.median(rates),
                       "peak_bytes": statistics.median(r["peak"] for r in rs),
                       "peak_over_held": statistics.median(ratios)},
            "min_max": {"seconds": [min(secs), max(secs)], "mb_per_s": [min(rates), max(rates)],
                        "peak_bytes": [min(r["peak"] for r in rs), max(r["peak"] for r in rs)],
                        "peak_over_held": [min(ratios), max(ratios)]}}
    return result


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--folder", default=None, help="an existing Hugging Face folder (else a synthetic one)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--ffn", type=int, default=4096)
    ap.add_argument("--vocab", type=int, default=16000)
    ap.add_argument("--rows", default="pretrained,tp1,tp2", help="which rows (pretrained, tp1, tp2)")
    ap.add_argument("--json", default=None, help="write the results here")
    a = ap.parse_args(argv)
    table = {"pretrained": ("from_pretrained", ("pretrained",)), "tp1": ("trainer tp1", ("trainer", 1, 0)),
             "tp2": ("trainer tp2 rank 0", ("trainer", 2, 0))}
    rows = dict(table[k] for k in a.rows.split(","))
    if a.folder:
        result = run(a.folder, a.repeats, rows)
    else:
        with tempfile.TemporaryDirectory(prefix="hf_load_") as tmp:
            folder = os.path.join(tmp, "llama")
            make_folder(folder, a.hidden, a.layers, a.ffn, a.vocab)
            result = run(folder, a.repeats, rows)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
