"""Worker side of tests/test_generation_msrun.py: ``run_mindformer.main`` for each argv in turn (``run_mode:
predict`` under msrun), with the generator's steps recorded: every step's last-column logits, this rank's
KV-cache shape and query-projection weight shape, and what the rank printed (rank 0 streams, the others
stay quiet)."""
import contextlib
import io

import numpy as np

import run_mindformer
from mindformers_core.generation import Generator


def run(argvs):
    calls = []
    step, generate = Generator.run_step, Generator.generate

    def recording_generate(self, prompts, *args, **kwargs):
        calls.append({"steps": []})
        return generate(self, prompts, *args, **kwargs)

    def recording_step(self, *args):
        out = step(self, *args)
        if not calls[-1]["steps"]:
            params = dict(self.model.parameters_and_names())
            cache = self._caches[0]         # KVCache: key heads; multi-latent attention's LatentKVCache: latents
            q = next(params[f"decoder.layers.0.self_attention.{n}.weight"] for n in ("linear_q", "linear_q_up_proj")
                     if f"decoder.layers.0.self_attention.{n}.weight" in params)
            stored = cache.key_cache if hasattr(cache, "key_cache") else cache.latent_cache
            calls[-1].update(cache=tuple(stored.shape), linear_q=tuple(q.shape))
        calls[-1]["steps"].append(out.asnumpy()[:, -1, :])
        return out

    results = []
    Generator.run_step, Generator.generate = recording_step, recording_generate
    try:
        for argv in argvs:
            calls.clear()
            printed = io.StringIO()
            with contextlib.redirect_stdout(printed):
                code = run_mindformer.main(argv)
            results.append({"code": code, "printed": printed.getvalue(),
                             "calls": [{"logits": np.stack(c["steps"]), "cache": c["cache"],
                                        "linear_q": c["linear_q"]} for c in calls]})
    finally:
        Generator.run_step, Generator.generate = step, generate
    return results
