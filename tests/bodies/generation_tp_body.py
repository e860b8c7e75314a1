"""Worker side of tests/test_generation_msrun.py: a transformers-made fixture loaded whole on every rank,
its generation step (model + KV caches) parallelized at tp2 (heads and MLP split, each rank its cache slice of
the key/value heads), the three fixture prompts as one batch; returns the ids and every step's logits."""
import dataclasses
import os

import numpy as np

from mindformers_core.distributed import get_env
from mindformers_core.generation import GenerationConfig, Generator
from mindformers_core.models.hf.config import read_hf_config
from mindformers_core.models.hf.pretrained import from_pretrained

DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data", "hf")


def generate(name, mode, tp):
    folder = os.path.join(DATA, name)
    _, _, generation = read_hf_config(folder)
    ref = np.load(os.path.join(folder, "reference.npz"))
    prompts = [[int(t) for t in ref[f"prompt_{i}"]] for i in range(3)]
    model = from_pretrained(folder, seq_length=16)
    parallel = dataclasses.replace(model.config, tensor_model_parallel_size=tp) if tp > 1 else None
    gen = Generator(model, GenerationConfig.from_dict(generation, {"max_new_tokens": 32}), jit=mode == "jit",
                    parallel_config=parallel)
    steps = []
    original = gen.run_step

    def recording(*args):
        out = original(*args)
        steps.append(out.asnumpy()[:, -1, :])
        return out
    gen.run_step = recording
    results, _ = gen.generate(prompts)
    params = dict(model.parameters_and_names())
    return {"ids": [r.token_ids for r in results], "logits": np.stack(steps),
            "cache": tuple(gen._caches[0].key_cache.shape),
            "linear_q": tuple(params["decoder.layers.0.self_attention.linear_q.weight"].shape)}


def run(names=("qwen3", "qwen3_moe"), modes=("pynative", "jit"), tp=2):
    get_env()
    # the one-process run on every rank too (side by side on the cores, instead of after the launch)
    return {name: {mode: {"tp": generate(name, mode, tp), "one": generate(name, mode, 1)} for mode in modes}
            for name in names}
