"""Load a MindFormers-style YAML config: safe parsing, dotted overrides, validation, typed result.

Everything here is plain Python and runs before any process group exists, so a bad config fails
on every rank in milliseconds with one message listing every problem, instead of hanging in the
first collective. Errors read ``<key path> = <value>: <rule>`` (see docs/config.md).
"""
from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Set, Tuple, Union

import yaml

from .dialects import GRAPH, detect, merge_pretrained_model_dir, override_known, suggest, translate, unknown
from .rules import check_rules
from .schema import NOT_RUNNABLE, SCHEMA, TYPE_CHECKS, Field, Section, default_tree, lookup

Overrides = Union[Mapping[str, Any], Sequence[Union[str, Tuple[str, Any]]]]


class ConfigError(ValueError):
    """Every problem of one config, one per line; ``errors`` keeps them as a list for tools and tests."""

    def __init__(self, errors: Sequence[str], source: str = "config"):
        self.errors, self.source = list(errors), source
        super().__init__(f"{len(self.errors)} problem(s) in {source}:\n" + "\n".join(f"  {e}" for e in errors))


class Config(dict):
    """A validated config: a dict with attribute access (``cfg.parallel_config.data_parallel``)."""

    def __init__(self, data: Mapping[str, Any] = ()):
        super().__init__({k: _wrap(v) for k, v in dict(data).items()})

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            close = difflib.get_close_matches(name, [str(k) for k in self], n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise AttributeError(f"config has no key {name!r}{hint}") from None

    def to_dict(self) -> Dict[str, Any]:
        """A plain nested dict/list copy (for yaml.safe_dump, JSON, checkpoints' metadata)."""
        return _unwrap(self)


def _wrap(v: Any) -> Any:
    if isinstance(v, Mapping):
        return Config(v)
    return [_wrap(x) for x in v] if isinstance(v, list) else v


def _unwrap(v: Any) -> Any:
    if isinstance(v, Mapping):
        return {k: _unwrap(x) for k, x in v.items()}
    return [_unwrap(x) for x in v] if isinstance(v, list) else v


class _Loader(yaml.SafeLoader):
    """SafeLoader that also reads ``1e-3`` as a float (YAML 1.2); PyYAML alone makes it a string."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*\.[0-9_]*(?:[eE][-+]?[0-9]+)?|\.[0-9_]+(?:[eE][-+]?[0-9]+)?"
               r"|[0-9][0-9_]*[eE][-+]?[0-9]+|\.(?:inf|Inf|INF)|[-+]\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"),
    list("-+0123456789."))


def _safe_load(text: str, source: str) -> Any:
    """Parse YAML without constructing objects from tags; parse failures become a ConfigError naming source."""
    try:
        return yaml.load(text, Loader=_Loader)  # noqa: S506 - _Loader is a SafeLoader subclass
    except yaml.constructor.ConstructorError as exc:
        mark = exc.problem_mark
        where = f"{source}:{mark.line + 1}" if mark else source
        raise ConfigError([f"{where}: {exc.problem}; configs are loaded with yaml.safe_load, which builds only "
                           "mappings, lists and scalars, never Python objects from tags"], source) from None
    except yaml.YAMLError as exc:
        raise ConfigError([f"{source}: not valid YAML: {exc}"], source) from None


def read_yaml(path: Union[str, Path]) -> Dict[str, Any]:
    """The raw mapping of a YAML file, loaded safely."""
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError([f"{source}: cannot read config file: {exc.strerror}"], source) from None
    data = _safe_load(text, source)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError([f"{source}: the top level must be a mapping of keys, got {type(data).__name__}"], source)
    return data


def parse_overrides(overrides: Overrides) -> List[Tuple[str, Any]]:
    """Normalise overrides to (dotted key, value) pairs.

    Accepts a mapping, (key, value) pairs, ``"key=value"`` strings, or argv-style tokens
    ``["--a.b.c", "value", ...]`` as run_mindformer.py receives them. String values are parsed as
    YAML scalars, so ``"2"`` becomes 2 and ``"True"`` becomes True, as MindFormers does.
    """
    items = list(overrides.items()) if isinstance(overrides, Mapping) else list(overrides)
    pairs: List[Tuple[str, Any]] = []
    i = 0
    while i < len(items):
        item = items[i]
        if isinstance(item, tuple):
            pairs.append((item[0].lstrip("-"), item[1]))
        elif item.startswith("--") and "=" not in item:
            if i + 1 >= len(items):
                raise ConfigError([f"{item}: override has no value"], "overrides")
            pairs.append((item[2:], items[i + 1]))
            i += 1
        elif "=" in item:
            key, value = item.split("=", 1)
            pairs.append((key.lstrip("-"), value))
        else:
            raise ConfigError([f"{item!r}: override must be '--a.b value' or 'a.b=value'"], "overrides")
        i += 1
    return [(k, _safe_load(v, f"override --{k}") if isinstance(v, str) else v) for k, v in pairs]


def closest_key(path: str) -> Optional[str]:
    """The valid key path most like ``path`` (graph-mode dialect: the schema's keys and the MindFormers keys
    of :mod:`.mindformers_keys`): the same name elsewhere (a misplaced key), a similar sibling, a similar
    name elsewhere, then a similar full path."""
    return suggest(path, GRAPH)


def _unknown(path: str, value: Any) -> str:
    suggestion = closest_key(path)
    hint = f"; did you mean {suggestion!r}?" if suggestion else ""
    return f"{path} = {value!r}: unknown key{hint}"


def _override_target(path: str, dialect: str) -> Optional[str]:
    """The schema key an override (or a file key) sets, to drop other spellings of it from the file."""
    from . import mindformers_keys as K
    table = K.GRAPH_ALIASES if dialect == GRAPH else K.PYNATIVE_ALIASES
    if path in table:
        return table[path]
    for prefix in ("model.model_config.", "model."):
        if path.startswith(prefix) and "." not in path[len(prefix):]:
            name = path[len(prefix):]
            return "model.model_config." + K.MODEL_ALIASES.get(name, name)
    return path if dialect == GRAPH and lookup(path) is not None else None


def _drop_other_spellings(raw: Dict[str, Any], key: str, dialect: str) -> None:
    target = _override_target(key, dialect)
    if target is None:
        return
    parent, _, _ = key.rpartition(".")
    candidates = [f"{parent}.{k}" if parent else k for k in (_node(raw, parent) or {})]
    from . import mindformers_keys as K
    table = K.GRAPH_ALIASES if dialect == GRAPH else K.PYNATIVE_ALIASES
    candidates += [k for k, v in table.items() if v == target] + ([target] if dialect == GRAPH else [])
    for other in candidates:
        if other != key and _override_target(other, dialect) == target:
            node = _node(raw, other.rpartition(".")[0])
            if isinstance(node, dict):
                node.pop(other.rpartition(".")[2], None)


def _node(raw: Dict[str, Any], path: str) -> Any:
    node: Any = raw
    for part in path.split(".") if path else []:
        if not isinstance(node, dict):
            return None
        node = node.get(part)
    return node


def apply_overrides(raw: Dict[str, Any], pairs: Iterable[Tuple[str, Any]], errors: List[str],
                    dialect: str = GRAPH) -> None:
    """Set each dotted key in ``raw`` (the file's own dialect); keys the dialect does not know are
    reported, not created. An override replaces the file's other spellings of the same setting
    (``--model.model_config.num_layers`` replaces ``num_hidden_layers``)."""
    for key, value in pairs:
        if not override_known(key, dialect):
            errors.append(unknown(key, value, dialect, "unknown override key"))
            continue
        _drop_other_spellings(raw, key, dialect)
        node, parts = raw, key.split(".")
        for part in parts[:-1]:
            if node.get(part) is None:
                node[part] = {}
            if not isinstance(node[part], dict):
                errors.append(f"{key} = {value!r}: cannot override inside {part} = {node[part]!r}, not a mapping")
                break
            node = node[part]
        else:
            node[parts[-1]] = value


def _check_field(path: str, value: Any, f: Field) -> Optional[str]:
    """The first rule ``value`` breaks: type, then enum, then lower bound."""
    if not any(TYPE_CHECKS[t](value) for t in f.types):
        return f"{path} = {value!r}: must be {' or '.join(f.types)} (got {type(value).__name__})"
    if f.choices and value is not None and value not in f.choices:
        why = NOT_RUNNABLE.get(path, {}).get(value) if isinstance(value, str) else None
        return f"{path} = {value!r}: " + (f"{why}; " if why else "") + f"must be one of {list(f.choices)}"
    if f.min is not None and isinstance(value, (int, float)) and not isinstance(value, bool) and value < f.min:
        return f"{path} = {value!r}: must be >= {f.min:g}"
    return None


def check_tree(value: Any, section: Section, path: str, errors: List[str], bad: Set[str]) -> Any:
    """Type-check ``value`` against ``section``; return it with defaults filled. Bad paths go to ``bad``."""
    if section.is_list:
        if value is None:
            return [dict(d) for d in section.default_list]
        if not isinstance(value, list):
            errors.append(f"{path} = {value!r}: must be a list of mappings")
            bad.add(path)
            return []
        item = Section(section.fields, section.doc)
        return [check_tree(v, item, f"{path}[{i}]", errors, bad) for i, v in enumerate(value)]
    if value is None:
        value = {}
    if not isinstance(value, dict):
        errors.append(f"{path or '<top level>'} = {value!r}: must be a mapping with keys {list(section.fields)}")
        bad.add(path)
        return default_tree(section)
    prefix = f"{path}." if path else ""
    out: Dict[str, Any] = {}
    for key, v in value.items():
        if key not in section.fields:
            errors.append(_unknown(prefix + str(key), v))
    for name, node in section.fields.items():
        sub = prefix + name
        if isinstance(node, Section):
            out[name] = check_tree(value.get(name), node, sub, errors, bad)
        elif name not in value:
            if node.required:
                errors.append(f"{sub} is missing: required ({' or '.join(node.types)})")
                bad.add(sub)
            out[name] = None if node.required else _copy(node.default)
        else:
            problem = _check_field(sub, value[name], node)
            if problem:
                errors.append(problem)
                bad.add(sub)
            out[name] = value[name]
    return out


def _copy(v: Any) -> Any:
    return list(v) if isinstance(v, list) else v


def validate(raw: Mapping[str, Any], overrides: Overrides = (), worker_num: int = 1,
             source: str = "<dict>") -> Config:
    """Apply overrides to ``raw``, check it, and return the typed config or raise one ConfigError."""
    if not isinstance(worker_num, int) or isinstance(worker_num, bool) or worker_num < 1:
        raise ConfigError([f"worker_num = {worker_num!r}: must be an int >= 1"], source)
    errors: List[str] = []
    raw = _unwrap(raw)
    dialect = detect(raw)
    apply_overrides(raw, parse_overrides(overrides), errors, dialect)
    merged, origins = merge_pretrained_model_dir(raw, dialect)      # config.json under the YAML's model keys
    errors += merged
    internal, report, problems = translate(raw, worker_num, dialect)
    report.origin.update(origins)
    errors += problems
    checked: List[str] = []
    bad: Set[str] = set()
    tree = check_tree(internal, SCHEMA, "", checked, bad)
    checked += check_rules(tree, worker_num, bad)
    errors += [report.rename(e) for e in checked]
    if errors:
        raise ConfigError(errors, source)
    config = Config(tree)
    config.report = report          # dialect, keys not applied, the user's names (attribute, not a key)
    return config


def load_config(path: Union[str, Path], overrides: Overrides = (), worker_num: int = 1) -> Config:
    """Read, override and validate a YAML config for ``worker_num`` workers (msrun --worker_num).

    Raises ConfigError listing every problem (unsafe tags, unknown keys with the closest valid key,
    wrong types, bad enum values, parallel sizes that do not fit the workers or the model).
    """
    return validate(read_yaml(path), overrides, worker_num, source=str(path))
