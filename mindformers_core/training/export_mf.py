"""Export a trained model as a MindFormers checkpoint, so that a model fine-tuned here goes back to MindFormers:
from a distributed checkpoint of any layout, or from the live model at the end of a run
(``run_mindformer.py --export_mf_dir DIR``).

The checkpoint is merged to whole tensors (as ``export_hf``), named and laid out as MindFormers' through the
family's MindFormers table (``models/mindformers/names.py``: the legacy scheme for Llama / Qwen2, mcore for Qwen3,
Qwen3-MoE, DeepSeek-V3 -- or ``scheme``; the fused layouts from the YAML's MindFormers keys) and written by
``models/mindformers/export.py``: MindFormers' unified folder (``part<k>.safetensors`` + ``param_name_map.json``)
or, for a path ending in ``.ckpt`` / ``.safetensors``, one file.

    python -m mindformers_core.training.export_mf --config run.yaml --checkpoint out/checkpoint --output mf_out
"""
from __future__ import annotations

import argparse
import sys
from typing import Callable, Optional

import numpy as np

from ..checkpoint import CheckpointError, checkpoint_specs, load_checkpoint
from ..models import get_model_spec
from .config import Config, ConfigError
from .export_hf import _is_state, _lora_of, lora_base_state, parse_size


def model_config_of(cfg: Config):
    """The TransformerConfig of the run's model (sizes and heads; the parallel layout does not matter here)."""
    spec = get_model_spec(cfg.model.arch.type)
    return spec.config_class.from_model_config(cfg.model.model_config.to_dict())


def mindformers_table(cfg: Config, model_config=None, scheme: Optional[str] = None):
    """The family's MindFormers table for writing (``scheme`` or the family's default)."""
    from ..models.mindformers.names import adapter_for
    spec = get_model_spec(cfg.model.arch.type)
    try:
        return adapter_for(spec.model_type, model_config or model_config_of(cfg), scheme=scheme,
                           model_config=cfg.model.model_config.to_dict())
    except ValueError as e:
        raise ConfigError([f"MindFormers export: {e}"]) from None


def export_checkpoint(cfg: Config, checkpoint: str, output: str, step="latest", scheme: Optional[str] = None,
                      model_config=None, dtype: Optional[str] = None, max_part_size="2GB",
                      log: Callable[[str], None] = print) -> str:
    """Merge ``checkpoint`` (a trainer checkpoint directory or one of its ``step_<k>``) and write it as the
    MindFormers checkpoint ``output``."""
    from ..models.mindformers.export import write_checkpoint
    from .preflight import resolve_checkpoint
    root, step_found = resolve_checkpoint(checkpoint, "checkpoint")
    if root in ("file", "hf", "mf"):
        raise ConfigError([f"checkpoint = {checkpoint!r}: give a trainer checkpoint directory (or a step_<k> in it)"])
    step = step_found if step == "latest" else step
    try:
        state = load_checkpoint(root, checkpoint_specs(root, step), rank=0, step=step)
    except CheckpointError as e:
        raise ConfigError([f"checkpoint = {checkpoint!r}: {e}"]) from None
    state = {k: v for k, v in state.items() if not _is_state(k)}
    lora = _lora_of(cfg)
    if lora is not None:            # an adapter checkpoint: the base + the merged deltas
        from ..peft.export import merge_lora
        spec = get_model_spec(cfg.model.arch.type)
        state = merge_lora(lora_base_state(cfg, spec.state_dict_adapter), state, lora.scaling)
    adapter = mindformers_table(cfg, model_config, scheme)
    try:
        out = write_checkpoint(output, state, adapter, dtype=dtype, max_part_bytes=parse_size(max_part_size))
    except KeyError as e:
        raise ConfigError([f"MindFormers export ({adapter.scheme} names): {e.args[0]}"]) from None
    n = sum(int(np.prod(v.shape)) for v in state.values())
    log(f"exported {len(state)} tensors ({n / 1e6:.2f}M parameters) of {root} step {step} as a MindFormers "
        f"checkpoint ({adapter.scheme} names): {out}")
    return out


def main(argv=None) -> int:
    from .config import read_yaml, validate
    ap = argparse.ArgumentParser(prog="python -m mindformers_core.training.export_mf",
                                 description="Write a trainer checkpoint (any layout) as a MindFormers checkpoint.")
    ap.add_argument("--config", required=True, help="the run's YAML (the model family and sizes)")
    ap.add_argument("--checkpoint", required=True, help="<output_dir>/checkpoint or one of its step_<k>")
    ap.add_argument("--output", required=True, help="a new folder (MindFormers' unified folder) or a .ckpt / "
                                                    ".safetensors file")
    ap.add_argument("--scheme", default=None, choices=["legacy", "mcore"],
                    help="MindFormers' names (default: the family's: legacy for llama / qwen2, mcore otherwise)")
    ap.add_argument("--dtype", default=None, choices=["float32", "float16", "bfloat16"],
                    help="cast the weights (default: as trained)")
    a = ap.parse_args(argv)
    try:
        cfg = validate(read_yaml(a.config), [], worker_num=1, source=a.config)
        export_checkpoint(cfg, a.checkpoint, a.output, scheme=a.scheme, dtype=a.dtype)
    except (ConfigError, ValueError, FileExistsError) as e:
        print(f"export_mf: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
