"""Training entry layer: YAML config schema and validation (the Trainer will join it here).

See docs/config.md for every key, its default and its rule.
"""
from .config import Config, ConfigError, closest_key, load_config, parse_overrides, read_yaml, validate
from .schema import SCHEMA, schema_markdown

__all__ = ["Config", "ConfigError", "SCHEMA", "closest_key", "load_config", "parse_overrides", "read_yaml",
           "schema_markdown", "validate"]
