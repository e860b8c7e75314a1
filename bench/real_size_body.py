"""One measurement of bench/real_size.py, in a fresh process: ``python bench/real_size_body.py ROW 'JSON'``.

Prints ``RESULT {json}`` as its last line. The rows whose names start with ``torch_`` run under the torch venv's
interpreter (they import torch and transformers, never the project); ``numpy_matmul`` imports NumPy only; the
others import MindSpore and the project (never torch). Arguments (JSON): ``folder``, ``threads`` and the row's own
(``length``, ``mode``, ``steps``, ``prompts``, ``new``, ``tokens``, ``layers``...). See bench/real_size.py.
"""
from __future__ import annotations

import json
import os
import re
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def status(key: str) -> int:
    """A /proc/self/status entry in bytes (VmRSS, VmHWM)."""
    with open("/proc/self/status") as f:
        return int(re.search(key + r":\s+(\d+) kB", f.read()).group(1)) * 1024


def folder_bytes(folder: str) -> int:
    return sum(os.path.getsize(os.path.join(folder, n)) for n in os.listdir(folder) if n.endswith(".safetensors"))


def median(xs):
    return statistics.median(xs) if xs else None


# ---- MindSpore and the project -----------------------------------------------------------------------------
def ms_setup(threads: int):
    """The trainer's CPU defaults for one process: kernels on ``threads`` threads, eager ops in the calling
    thread (``context.pynative_synchronize``, on for CPU)."""
    sys.path.insert(0, ROOT)
    import mindspore as ms
    ms.set_context(mode=ms.PYNATIVE_MODE, device_target="CPU", pynative_synchronize=True)
    if threads:
        ms.device_context.cpu.op_tuning.threads_num(threads)
    return ms


def pretrained(folder: str, length, first_call):
    """``from_pretrained(folder)``, then ``first_call(model)``; when that fails on the length (a model that takes
    only ids of ``seq_length`` tokens), ``from_pretrained(folder, seq_length=length)`` and the call again.
    Returns (model, first call's seconds, its output, how the model was built)."""
    from mindformers_core.models.hf.pretrained import from_pretrained
    model = from_pretrained(folder)
    t0 = time.perf_counter()
    try:
        out = first_call(model)
        return model, time.perf_counter() - t0, out, "from_pretrained(folder): any length"
    except Exception as e:       # noqa: BLE001 -- any failure of the first call: retry with seq_length = length
        if length is None:
            raise
        why = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
    del model
    model = from_pretrained(folder, seq_length=length)
    t0 = time.perf_counter()
    out = first_call(model)
    return model, time.perf_counter() - t0, out, f"from_pretrained(folder, seq_length={length}) (without: {why})"


def ms_load(a):
    ms_setup(a["threads"])
    from mindformers_core.models.hf.pretrained import from_pretrained
    base = status("VmRSS")
    t0 = time.perf_counter()
    model = from_pretrained(a["folder"])
    seconds = time.perf_counter() - t0
    params = list(model.get_parameters())
    return {"seconds": seconds, "folder_bytes": folder_bytes(a["folder"]), "held": sum(p.nbytes for p in params),
            "params": sum(int(p.size) for p in params), "base_rss": base, "peak_rss": status("VmHWM"),
            "peak": status("VmHWM") - base, "dtype": str(params[0].dtype)}


def _ids(vocab, shape, seed=0):
    import numpy as np
    return np.random.default_rng(seed).integers(0, vocab, shape).astype(np.int32)


def _save_row(path, logits_row):
    if path:
        import numpy as np
        np.save(path, np.asarray(logits_row, np.float32))


def ms_forward(a):
    ms = ms_setup(a["threads"])
    from mindspore import Tensor
    from mindformers_core.common.graphs import compile_blocking
    n, jit = a["length"], a["mode"] == "jit"
    vocab = json.load(open(os.path.join(a["folder"], "config.json")))["vocab_size"]
    ids = Tensor(_ids(vocab, (1, n)))
    holder = {}

    def call(model):
        if "fn" not in holder or holder["model"] is not model:
            holder["model"] = model
            if jit:
                def forward(x):
                    return model(x)
                holder["fn"] = compile_blocking(forward)
            else:
                holder["fn"] = model
        out = holder["fn"](ids)
        return out[0, -1].asnumpy()       # a small read: the call has finished

    model, first, row, how = pretrained(a["folder"], n, call)
    times = []
    for _ in range(a["calls"]):
        t0 = time.perf_counter()
        call(model)
        times.append(time.perf_counter() - t0)
    _save_row(a.get("save"), row)
    steady = median(times)
    return {"first": first, "times": times, "steady": steady, "compile": first - steady if jit else None,
            "how": how, "peak_rss": status("VmHWM")}


def ms_train(a):
    ms = ms_setup(a["threads"])
    from mindspore import Tensor
    from mindformers_core.common.graphs import compile_blocking
    from mindformers_core.optim import AdamW
    n, jit = a["length"], a["mode"] == "jit"
    vocab = json.load(open(os.path.join(a["folder"], "config.json")))["vocab_size"]
    raw = _ids(vocab, (1, n + 1))
    ids, labels = Tensor(raw[:, :-1]), Tensor(raw[:, 1:])
    base = status("VmRSS")
    holder = {}

    def call(model):
        if holder.get("model") is not model:
            holder.clear()
            opt = AdamW(model.trainable_params(), 1e-5, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
            grad_fn = ms.value_and_grad(model, None, opt.parameters)

            def step(x, y):
                loss, grads = grad_fn(x, y)
                opt(grads)
                return loss
            holder.update(model=model, opt=opt, fn=compile_blocking(step) if jit else step)
        return float(holder["fn"](ids, labels).asnumpy())

    model, first, loss, how = pretrained(a["folder"], n, call)
    times, losses = [], [loss]
    for _ in range(a["steps"] - 1):
        t0 = time.perf_counter()
        losses.append(call(model))
        times.append(time.perf_counter() - t0)
    params = model.trainable_params()
    n_params = sum(int(p.size) for p in params)
    steady = median(times[a["warmup"]:] or times)
    return {"first": first, "times": [first] + times, "steady": steady, "compile": first - steady if jit else None,
            "losses": losses, "how": how, "params": n_params, "analytic": 4 * n_params * 4, "base_rss": base,
            "peak_rss": status("VmHWM"), "dtype": str(params[0].dtype)}


def ms_generate(a):
    ms_setup(a["threads"])
    from mindformers_core.generation import GenerationConfig, Generator
    from mindformers_core.models.hf.pretrained import from_pretrained
    prompts = a["prompts"]
    try:
        model, how = from_pretrained(a["folder"]), "from_pretrained(folder)"
        gen = Generator(model, GenerationConfig(max_new_tokens=a["new"], eos_token_id=[]), jit=True)
        runs = [_generate(gen, prompts)]
    except Exception as e:      # noqa: BLE001 -- a model of seq_length tokens only: the cache's length
        length = len(prompts[0]) + a["new"]
        how = (f"from_pretrained(folder, seq_length={length}) (without: {type(e).__name__}: "
               f"{str(e).splitlines()[0][:200] if str(e) else ''})")
        model = from_pretrained(a["folder"], seq_length=length)
        gen = Generator(model, GenerationConfig(max_new_tokens=a["new"], eos_token_id=[]), jit=True)
        runs = [_generate(gen, prompts)]
    for _ in range(a["runs"] - 1):
        runs.append(_generate(gen, prompts))
    rest = runs[1:] or runs
    wall = median([r["wall"] for r in rest])
    return {"how": how, "first_wall": runs[0]["wall"], "wall": wall, "compile": runs[0]["wall"] - wall,
            "prefill_seconds": median([r["prefill_seconds"] for r in rest]),
            "prefill_tokens_per_s": median([r["prefill_tokens_per_s"] for r in rest]),
            "decode_tokens_per_s": median([r["decode_tokens_per_s"] for r in rest]),
            "runs": runs, "ids": runs[-1]["ids"], "peak_rss": status("VmHWM")}


def _generate(gen, prompts):
    t0 = time.perf_counter()
    results, stats = gen.generate([list(p) for p in prompts])
    wall = time.perf_counter() - t0
    return {"wall": wall, "prefill_seconds": stats.prefill_seconds, "prefill_tokens_per_s": stats.prefill_tokens_per_s,
            "decode_tokens_per_s": stats.decode_tokens_per_s, "decode_seconds": stats.decode_seconds,
            "decode_tokens": stats.decode_tokens, "ids": [r.new_ids for r in results]}


def matmul_shapes(config: dict, tokens: int, layers=None):
    """(m, k, n) of every matmul of the model's forward over ``tokens`` tokens: per layer q, k, v, o, gate, up,
    down, then the vocabulary head."""
    h, f = config["hidden_size"], config["intermediate_size"]
    d = config.get("head_dim") or h // config["num_attention_heads"]
    q, kv = config["num_attention_heads"] * d, config["num_key_value_heads"] * d
    per_layer = [(tokens, h, q), (tokens, h, kv), (tokens, h, kv), (tokens, q, h), (tokens, h, f), (tokens, h, f),
                 (tokens, f, h)]
    n = config["num_hidden_layers"] if layers is None else layers
    return per_layer * n + [(tokens, h, config["vocab_size"])]


def _matmul_run(a, make, mm, sync):
    import numpy as np
    config = json.load(open(os.path.join(a["folder"], "config.json")))
    shapes = matmul_shapes(config, a["tokens"])
    rng = np.random.default_rng(0)
    xs = {}
    ws = []
    for m, k, n in shapes:
        if (m, k) not in xs:
            xs[(m, k)] = make(rng.random((m, k), np.float32) - 0.5)
        ws.append(make((rng.random((k, n), np.float32) - 0.5) * 0.05))    # a weight per matmul, as the model has
    passes = []
    for _ in range(a["passes"]):
        t0 = time.perf_counter()
        out = None
        for (m, k, n), w in zip(shapes, ws):
            out = mm(xs[(m, k)], w)
        sync(out)
        passes.append(time.perf_counter() - t0)
    flops = sum(2 * m * k * n for m, k, n in shapes)
    steady = median(passes[1:] or passes)
    return {"passes": passes, "seconds": steady, "flops": flops, "gflops": flops / steady / 1e9,
            "matmuls": len(shapes)}


def ms_matmul(a):
    ms_setup(a["threads"])
    from mindspore import Tensor, ops
    return _matmul_run(a, Tensor, ops.matmul, lambda out: out[:1, :1].asnumpy())


def numpy_matmul(a):
    return _matmul_run(a, lambda x: x, lambda x, w: x @ w, lambda out: None)


def ms_compile(a):
    """A random-weight model from the folder's config with ``num_layers`` = ``layers``: compile seconds (first
    call minus the steady one) of its forward (1, 64), its training step (1, 256) or a generate (1 prompt)."""
    ms = ms_setup(a["threads"])
    from mindspore import Tensor
    from mindformers_core.common.graphs import compile_blocking
    from mindformers_core.models.hf.config import read_hf_config
    spec, cfg, _ = read_hf_config(a["folder"])
    what, n = a["what"], a["length"]
    cfg = dict(cfg, num_layers=a["layers"])
    positions = cfg.get("max_position_embeddings")
    if positions:     # as from_pretrained does: any length up to the folder's limit
        cfg["seq_length"] = min(int(cfg.get("seq_length") or positions), int(positions))

    def build(extra):
        # zero weights, no random draws (deferred_init, never materialized): a compile does not depend on the
        # values, and drawing 600M normals took longer than the compiles measured here
        from mindformers_core.transformer.init import deferred_init
        ms.set_seed(0)
        model_cfg = spec.config_class.from_model_config(dict(cfg, **extra))
        if positions and getattr(model_cfg, "max_position_embeddings", 0) is None:
            model_cfg.max_position_embeddings = int(positions)
        with deferred_init():
            return spec.model_class(model_cfg)

    t0 = time.perf_counter()
    model = build({})
    built = time.perf_counter() - t0
    how = "any length"
    vocab = cfg["vocab_size"]
    if what == "generate":
        from mindformers_core.generation import GenerationConfig, Generator
        prompts = [_ids(vocab, (a["prompt"],)).tolist()]

        def make(m):
            return Generator(m, GenerationConfig(max_new_tokens=a["new"], eos_token_id=[]), jit=True)
        try:
            gen = make(model)
            first = _generate(gen, prompts)["wall"]
        except Exception as e:   # noqa: BLE001
            how = f"seq_length={a['prompt'] + a['new']} ({type(e).__name__})"
            model = build({"seq_length": a["prompt"] + a["new"]})
            gen = make(model)
            first = _generate(gen, prompts)["wall"]
        times = [_generate(gen, prompts)["wall"] for _ in range(a["calls"])]
    else:
        if what == "forward":
            ids = (Tensor(_ids(vocab, (1, n))),)

            def fn_of(m):
                def forward(x):
                    return m(x)
                return compile_blocking(forward)
        else:
            from mindformers_core.optim import AdamW
            raw = _ids(vocab, (1, n + 1))
            ids = (Tensor(raw[:, :-1]), Tensor(raw[:, 1:]))

            def fn_of(m):
                opt = AdamW(m.trainable_params(), 1e-5, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
                grad_fn = ms.value_and_grad(m, None, opt.parameters)

                def step(x, y):
                    loss, grads = grad_fn(x, y)
                    opt(grads)
                    return loss
                return compile_blocking(step)

        def call(fn):
            out = fn(*ids)
            (out[0, -1, :4] if out.ndim == 3 else out).asnumpy()

        fn = fn_of(model)
        t0 = time.perf_counter()
        try:
            call(fn)
        except Exception as e:   # noqa: BLE001
            how = f"seq_length={n} ({type(e).__name__})"
            model = build({"seq_length": n})
            fn = fn_of(model)
            t0 = time.perf_counter()
            call(fn)
        first = time.perf_counter() - t0
        times = []
        for _ in range(a["calls"]):
            t0 = time.perf_counter()
            call(fn)
            times.append(time.perf_counter() - t0)
    steady = median(times)
    return {"first": first, "times": times, "steady": steady, "compile": first - steady, "build": built,
            "how": how, "peak_rss": status("VmHWM")}


# ---- torch and transformers (the torch venv) --------------------------------------------------------------
def torch_setup(threads: int):
    import torch
    if threads:
        torch.set_num_threads(threads)
    return torch


def torch_model(folder, torch):
    from transformers import AutoModelForCausalLM
    try:
        return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    except TypeError:            # transformers 4.x spelling
        return AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.float32)


def _torch_meta(torch, model):
    import transformers
    return {"torch": torch.__version__, "transformers": transformers.__version__,
            "attn_implementation": getattr(model.config, "_attn_implementation", None),
            "threads": torch.get_num_threads()}


def torch_load(a):
    torch = torch_setup(a["threads"])
    import transformers  # noqa: F401  (imported before the clock, as ours are)
    base = status("VmRSS")
    t0 = time.perf_counter()
    model = torch_model(a["folder"], torch)
    seconds = time.perf_counter() - t0
    params = list(model.parameters())          # tied weights counted once
    return {"seconds": seconds, "folder_bytes": folder_bytes(a["folder"]),
            "held": sum(p.numel() * p.element_size() for p in params), "params": sum(p.numel() for p in params),
            "base_rss": base, "peak_rss": status("VmHWM"), "peak": status("VmHWM") - base,
            "dtype": str(params[0].dtype), **_torch_meta(torch, model)}


def torch_forward(a):
    torch = torch_setup(a["threads"])
    model = torch_model(a["folder"], torch).eval()
    vocab = model.config.vocab_size
    ids = torch.from_numpy(_ids(vocab, (1, a["length"])).astype("int64"))
    times = []
    with torch.no_grad():
        for i in range(a["calls"] + 1):
            t0 = time.perf_counter()
            out = model(input_ids=ids).logits
            times.append(time.perf_counter() - t0)
    _save_row(a.get("save"), out[0, -1].numpy())
    return {"first": times[0], "times": times[1:], "steady": median(times[1:]), "peak_rss": status("VmHWM"),
            **_torch_meta(torch, model)}


def torch_train(a):
    torch = torch_setup(a["threads"])
    base = status("VmRSS")
    model = torch_model(a["folder"], torch)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    raw = _ids(model.config.vocab_size, (1, a["length"] + 1)).astype("int64")
    ids, labels = torch.from_numpy(raw[:, :-1].copy()), torch.from_numpy(raw[:, :-1].copy())  # HF shifts labels
    times, losses = [], []
    for _ in range(a["steps"]):
        t0 = time.perf_counter()
        loss = model(input_ids=ids, labels=labels).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss))
        times.append(time.perf_counter() - t0)
    n_params = sum(p.numel() for p in model.parameters())
    return {"first": times[0], "times": times, "steady": median(times[1 + a["warmup"]:] or times[1:] or times),
            "losses": losses, "params": n_params, "analytic": 4 * n_params * 4, "base_rss": base,
            "peak_rss": status("VmHWM"), **_torch_meta(torch, model)}


def torch_generate(a):
    """``generate(do_sample=False)`` with transformers' KV cache: max_new_tokens=1 (prefill and the first token)
    and ``new``; decode tokens/s = rows x (new - 1) / (time(new) - time(1)), as ours counts the tokens after the
    first. Runs ``runs`` rounds of both (the first warms up)."""
    torch = torch_setup(a["threads"])
    model = torch_model(a["folder"], torch).eval()
    model.generation_config.eos_token_id = None          # never stop early: ours runs with eos_token_id=[]
    ids = torch.tensor(a["prompts"], dtype=torch.int64)
    mask = torch.ones_like(ids)
    b, new = ids.shape[0], a["new"]

    def gen(n):
        t0 = time.perf_counter()
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=n,
                                 min_new_tokens=n, pad_token_id=0, eos_token_id=None)
        return time.perf_counter() - t0, out[:, ids.shape[1]:].tolist()

    runs = []
    for _ in range(a["runs"]):
        one, _ = gen(1)
        full, out = gen(new)
        runs.append({"first_token": one, "wall": full, "decode_tokens_per_s": b * (new - 1) / max(full - one, 1e-9),
                     "tokens_per_s": b * new / full, "prefill_tokens_per_s": ids.numel() / one})
    rest = runs[1:] or runs
    return {"runs": runs, "first_token": median([r["first_token"] for r in rest]),
            "wall": median([r["wall"] for r in rest]),
            "decode_tokens_per_s": median([r["decode_tokens_per_s"] for r in rest]),
            "tokens_per_s": median([r["tokens_per_s"] for r in rest]),
            "prefill_tokens_per_s": median([r["prefill_tokens_per_s"] for r in rest]),
            "ids": out, "peak_rss": status("VmHWM"), **_torch_meta(torch, model)}


def torch_matmul(a):
    torch = torch_setup(a["threads"])
    with torch.no_grad():
        return dict(_matmul_run(a, torch.from_numpy, torch.matmul, lambda out: None), torch=torch.__version__,
                    threads=torch.get_num_threads())


ROWS = {"ms_load": ms_load, "ms_forward": ms_forward, "ms_train": ms_train, "ms_generate": ms_generate,
        "ms_matmul": ms_matmul, "numpy_matmul": numpy_matmul, "ms_compile": ms_compile, "torch_load": torch_load,
        "torch_forward": torch_forward, "torch_train": torch_train, "torch_generate": torch_generate,
        "torch_matmul": torch_matmul}


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    row, args = argv[0], json.loads(argv[1])
    result = ROWS[row](args)
    print("RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
