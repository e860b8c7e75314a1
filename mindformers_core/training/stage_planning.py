"""``parallel.pipeline_config.layers_per_stage: auto``: measure the configured model's layers on
one process and split them over the pipeline stages (``pipeline.planner`` does the measuring and
the planning; this module supplies the model from the config and shares the plan between ranks).
"""
from __future__ import annotations

import json
import os
import time
from typing import Any, Callable, Dict, Optional

from ..pipeline.planner import PLAN_FILE, StagePlan, measure_layers, plan_stages


def _get(cfg, path: str, default=None):
    node = cfg
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    return node


def registered_builder(arch: str) -> Callable[[Dict[str, Any]], Any]:
    """``model_config -> whole model`` for the registered model class ``arch`` (``model.arch.type``)."""
    from ..models import get_model_spec
    spec = get_model_spec(arch)

    def build(model_config: Dict[str, Any]):
        mc = {k: v for k, v in model_config.items() if k != "offset"}   # the whole model, one stage
        return spec.model_class(spec.config_class.from_model_config(mc, {}))
    return build


def auto_stage_plan(cfg, rank: int = 0, output_dir: Optional[str] = None, build_model: Optional[Callable] = None,
                    memory_limit_bytes: Optional[float] = None, steps: int = 3, timeout: float = 1800.0) -> StagePlan:
    """The stage plan for a config with ``parallel.pipeline_config.layers_per_stage: auto``.

    Rank 0 builds the whole model on one process (``build_model(model_config_dict)``, default the
    registered ``model.arch.type``), measures it on one microbatch (``runner_config.batch_size`` x
    ``seq_length`` tokens, in the config's ``context.mode``) and plans ``pipeline_stage x
    pipeline_interleave`` stages; it writes ``<output_dir>/stage_plan.json`` atomically. Other
    ranks wait for that file, so every rank uses the same split. A file written for the same
    model, batch and stage count is reused without measuring again (delete it to re-measure)."""
    import numpy as np

    mc = dict(_get(cfg, "model.model_config", {}) or {})
    pp = int(_get(cfg, "parallel_config.pipeline_stage", 1))
    vpp = int(_get(cfg, "parallel.pipeline_config.pipeline_interleave", 1))
    batch = int(_get(cfg, "runner_config.batch_size", 1))
    mode = "jit" if int(_get(cfg, "context.mode", 1)) == 0 else "pynative"
    arch = str(_get(cfg, "model.arch.type", "LlamaForCausalLM"))
    key = {"model_config": {k: v for k, v in mc.items() if k != "offset"}, "stages": pp * vpp, "batch": batch,
           "mode": mode, "memory_limit_bytes": memory_limit_bytes}
    if arch != "LlamaForCausalLM":     # (plans written before the registry keep their key)
        key["arch"] = arch
    key = json.loads(json.dumps(key, default=str))
    out_dir = output_dir or str(_get(cfg, "output_dir", "./output"))
    path = os.path.join(out_dir, PLAN_FILE)

    def read() -> Optional[StagePlan]:
        try:
            with open(path) as f:
                data = json.load(f)
        except (OSError, ValueError):
            return None
        return StagePlan.from_dict(data["plan"]) if data.get("key") == key else None

    plan = read()
    if plan is not None:
        return plan
    if rank != 0:
        deadline = time.monotonic() + timeout
        while plan is None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"auto_stage_plan: waited {timeout:.0f}s for rank 0 to write {path}")
            time.sleep(0.5)
            plan = read()
        return plan
    import mindspore as ms
    model = (build_model or registered_builder(arch))(mc)
    seq, vocab = int(mc["seq_length"]), int(mc["vocab_size"])
    ids = ms.Tensor(np.random.RandomState(0).randint(0, vocab, (batch, seq)), ms.int32)
    profile = measure_layers(model, ids, steps=steps, mode=mode)
    plan = plan_stages(profile, pp * vpp, memory_limit_bytes)
    plan.meta.update(source="measured", batch=batch, seq_length=seq, mode=mode, steps=steps,
                     layer_fwd=[c.fwd for c in profile.layers], layer_bwd=[c.bwd for c in profile.layers])
    os.makedirs(out_dir, exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump({"key": key, "plan": plan.to_dict()}, f, indent=1)
    os.replace(tmp, path)
    return plan
