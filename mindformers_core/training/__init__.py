"""Training layer: YAML config schema and validation, the Trainer and its command line.

``Trainer`` (wiring and loop) is built from one module per part: ``preflight`` (checks before any
process group), ``inputs``, ``model_builder``, ``steps``, ``checkpointing``, ``predict``;
``topology`` says where a rank sits, ``cli`` is ``run_mindformer.py``. See docs/config.md for every key.
"""
from .config import Config, ConfigError, closest_key, load_config, parse_overrides, read_yaml, validate
from .schema import SCHEMA, schema_markdown


def __getattr__(name):      # the Trainer imports MindSpore: only when asked for
    if name == "Trainer":
        from .trainer import Trainer
        return Trainer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["Config", "ConfigError", "SCHEMA", "Trainer", "closest_key", "load_config", "parse_overrides",
           "read_yaml", "schema_markdown", "validate"]
