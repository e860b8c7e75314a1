"""Export a trained model as a Hugging Face folder: from a distributed checkpoint of any layout, or from
the live model at the end of a run (``run_mindformer.py --export_hf_dir DIR``).

The checkpoint's parameters are merged to whole tensors (the distributed loader reads every shard: tp, pp
stages, ep experts, hsdp shards), named and shaped as Hugging Face's through the model family's table, and
written with ``models/hf/export.py`` (sharded safetensors + index, config.json, generation_config.json,
tokenizer files). config.json is the one of the folder the model came from (``pretrained_model_dir``)
when there is one, else written from the model config by the family.

    python -m mindformers_core.training.export_hf --config run.yaml --checkpoint out/checkpoint --output hf_out
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Callable, Optional

import numpy as np

from ..checkpoint import CheckpointError, checkpoint_specs, load_checkpoint
from ..models import get_model_spec
from .config import Config, ConfigError

SIZE_UNITS = {"": 1, "B": 1, "KB": 1000, "MB": 1000 ** 2, "GB": 1000 ** 3, "KIB": 1024, "MIB": 1024 ** 2,
              "GIB": 1024 ** 3}


def parse_size(text) -> int:
    """``"2GB"``, ``"500MB"``, ``"64KiB"`` or a byte count -> bytes (``max_shard_size`` as transformers writes it)."""
    if isinstance(text, int) and not isinstance(text, bool):
        return text
    s = str(text).strip().upper().replace(" ", "")
    num = s.rstrip("KMGIB")
    unit = s[len(num):]
    try:
        value = float(num)
    except ValueError:
        value = -1
    if unit not in SIZE_UNITS or value <= 0:
        raise ValueError(f"max_shard_size={text!r}: give bytes or a size like '2GB', '500MB', '64KiB'")
    return int(value * SIZE_UNITS[unit])


def _source_folder(cfg: Config) -> Optional[str]:
    """The Hugging Face folder the run started from: ``pretrained_model_dir``, or an HF folder as
    ``load_checkpoint``."""
    for key in ("pretrained_model_dir", "load_checkpoint"):
        value = cfg.get(key)
        if isinstance(value, str) and value and os.path.isfile(os.path.join(value, "config.json")):
            return value
    return None


def hf_config_for(cfg: Config) -> dict:
    """config.json of the export: the source folder's, else the family's writer applied to model_config."""
    source = _source_folder(cfg)
    if source is not None:
        from ..models.hf.folder import open_folder
        return dict(open_folder(source).config)
    spec = get_model_spec(cfg.model.arch.type)
    writer = getattr(spec, "hf_config_writer", None)
    if writer is None:
        try:
            from ..models.hf import config as hf_config
        except ImportError:
            hf_config = None
        writer = getattr(hf_config, "write_hf_config", None) if hf_config is not None else None
        if writer is None:
            raise ConfigError([f"model.arch.type = {cfg.model.arch.type!r}: no config.json to export (no "
                               "pretrained_model_dir, and no Hugging Face config writer for this family)"])
        return dict(writer(spec, cfg.model.model_config.to_dict()))
    return dict(writer(cfg.model.model_config.to_dict()))


def export_checkpoint(cfg: Config, checkpoint: str, output: str, step="latest", max_shard_size="2GB",
                      dtype: Optional[str] = None, log: Callable[[str], None] = print) -> str:
    """Merge ``checkpoint`` (a trainer checkpoint directory or one of its ``step_<k>``) and write it as the
    Hugging Face folder ``output``."""
    from ..models.hf.export import export_folder
    from .preflight import resolve_checkpoint
    spec = get_model_spec(cfg.model.arch.type)
    if spec.state_dict_adapter is None:
        raise ConfigError([f"model.arch.type = {spec.name!r}: this family has no Hugging Face name table, so it "
                           "cannot be exported as a Hugging Face folder"])
    root, step_found = resolve_checkpoint(checkpoint, "checkpoint")
    if root in ("file", "hf", "mf"):
        raise ConfigError([f"checkpoint = {checkpoint!r}: give a trainer checkpoint directory (or a step_<k> in it)"])
    step = step_found if step == "latest" else step
    try:
        specs = checkpoint_specs(root, step)
        state = load_checkpoint(root, specs, rank=0, step=step)
    except CheckpointError as e:
        raise ConfigError([f"checkpoint = {checkpoint!r}: {e}"]) from None
    state = {k: v for k, v in state.items() if not _is_state(k)}
    lora = _lora_of(cfg)
    if lora is not None:            # an adapter checkpoint: base (folder or checkpoint) + the merged deltas
        from ..peft.export import merge_lora
        state = merge_lora(lora_base_state(cfg, spec.state_dict_adapter), state, lora.scaling)
    source = _source_folder(cfg)
    from ..models.hf.folder import open_folder
    generation = open_folder(source).generation_config if source else None
    out = export_folder(output, state, spec.state_dict_adapter, hf_config_for(cfg), generation_config=generation,
                        tokenizer_from=source, max_shard_bytes=parse_size(max_shard_size), dtype=dtype)
    n = sum(int(np.prod(v.shape)) for v in state.values())
    log(f"exported {len(state)} tensors ({n / 1e6:.2f}M parameters) of {root} step {step} as a Hugging Face "
        f"folder: {out}")
    return out


def _lora_of(cfg: Config):
    raw = dict(cfg.model.model_config).get("pet_config")
    if raw is None:
        return None
    from ..peft import parse_lora
    return parse_lora(dict(raw), "model.model_config.pet_config")


def lora_base_source(cfg: Config) -> Optional[str]:
    """Where a LoRA run's frozen base weights come from: the model folder (``pretrained_model_dir`` or an HF
    folder as ``load_checkpoint``), else ``load_checkpoint`` (a full checkpoint or file)."""
    return _source_folder(cfg) or (cfg.get("load_checkpoint") or None)


def lora_base_state(cfg: Config, adapter) -> dict:
    """The base model's whole tensors under our names (LoRA export: the weights the adapters were trained on)."""
    from .preflight import resolve_checkpoint
    source = lora_base_source(cfg)
    if source is None:
        raise ConfigError(["LoRA export: no base weights (give pretrained_model_dir or load_checkpoint)"])
    root, step = resolve_checkpoint(source)
    if root == "mf":
        raise ConfigError([f"LoRA export: the base weights are a MindFormers checkpoint ({source}); merging adapters "
                           "onto it is not supported: give the base as pretrained_model_dir (a Hugging Face folder) "
                           "or a checkpoint of this trainer"])
    if root == "hf":
        from ..models.hf.folder import open_folder
        folder = open_folder(step)
        with folder.reader() as read:
            hf_state = {name: read(name) for name in folder.tensors}
        return adapter.from_hf(hf_state)
    if root == "file":
        from safetensors.numpy import load_file
        return load_file(step)
    return {k: v for k, v in load_checkpoint(root, checkpoint_specs(root, step), rank=0, step=step).items()
            if not _is_state(k)}


def export_peft(cfg: Config, checkpoint: str, output: str, step="latest", log: Callable[[str], None] = print) -> str:
    """The adapters of a LoRA checkpoint as a PEFT adapter folder (``adapter_model.safetensors`` +
    ``adapter_config.json``) for ``peft.PeftModel.from_pretrained(hf_base_model, output)``."""
    from ..peft.export import write_peft_adapter
    from .preflight import resolve_checkpoint
    lora = _lora_of(cfg)
    if lora is None:
        raise ConfigError(["PEFT adapter export: the config has no LoRA (model.model_config.pet_config / lora_config)"])
    spec = get_model_spec(cfg.model.arch.type)
    root, step_found = resolve_checkpoint(checkpoint, "checkpoint")
    step = step_found if step == "latest" else step
    try:
        state = load_checkpoint(root, checkpoint_specs(root, step), rank=0, step=step)
    except CheckpointError as e:
        raise ConfigError([f"checkpoint = {checkpoint!r}: {e}"]) from None
    adapters = {k: v for k, v in state.items() if k.endswith((".lora_a.weight", ".lora_b.weight"))}

    def hf_name_of(name):      # routed experts (A three-dimensional): the name of expert 0
        a = adapters.get(name + ".lora_a.weight")
        shape = None if a is None or a.ndim != 3 else (a.shape[0],)
        return spec.state_dict_adapter.hf_names(name, shape)[0]
    out = write_peft_adapter(output, adapters, lora, hf_name_of, base_model=_source_folder(cfg) or "")
    log(f"exported {len(adapters) // 2} LoRA adapters of {root} step {step} as a PEFT adapter: {out}")
    return out


def _is_state(name: str) -> bool:
    """Model state that is not a weight of the Hugging Face model (counters kept by our routers)."""
    return name.endswith(("tokens_per_expert", "forwards"))


def main(argv=None) -> int:
    from .config import read_yaml, validate
    ap = argparse.ArgumentParser(prog="python -m mindformers_core.training.export_hf",
                                 description="Write a trainer checkpoint (any layout) as a Hugging Face model folder.")
    ap.add_argument("--config", required=True, help="the run's YAML (the model family and sizes)")
    ap.add_argument("--checkpoint", required=True, help="<output_dir>/checkpoint or one of its step_<k>")
    ap.add_argument("--output", required=True, help="the folder to write (must not exist)")
    ap.add_argument("--max_shard_size", default="2GB", help="largest safetensors file (default 2GB)")
    ap.add_argument("--peft", action="store_true",
                    help="LoRA: write the adapters as a PEFT adapter folder instead of the merged model")
    ap.add_argument("--dtype", default=None, choices=["float32", "float16", "bfloat16"],
                    help="cast the weights (default: as trained)")
    a = ap.parse_args(argv)
    try:
        cfg = validate(read_yaml(a.config), [], worker_num=1, source=a.config)
        if a.peft:
            export_peft(cfg, a.checkpoint, a.output)
        else:
            export_checkpoint(cfg, a.checkpoint, a.output, max_shard_size=a.max_shard_size, dtype=a.dtype)
    except (ConfigError, ValueError, FileExistsError) as e:
        print(f"export_hf: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
