"""The model registry: ``model.arch.type`` in a YAML -> a model family's ``ModelSpec``.

A family is one package (``mindformers_core/models/<family>/``: config mapping, model and layer
spec, Hugging Face name table) registered with one ``@register_model(...)`` line. Built-in families
(``mindformers_core.models.llama``) register when ``mindformers_core.models`` is imported; user
families register themselves in a directory of their own, loaded by ``--register_path DIR``
(``import_register_path``), as in MindFormers.

A registered config class has ``from_model_config(model_config, parallel_config=None,
pipeline_interleave=1)`` returning a ``TransformerConfig``; a registered model class is built as
``model_class(config, pp_rank=0, vp_stage=None, layers_per_stage=None)``. The spec also names the
family's tokenizer kind (``data.tokenizer.build_tokenizer``), its layer spec function
(``transformer.spec``) and its state-dict adapter (Hugging Face names <-> ours,
``models.state_dict``). This module is pure Python (no MindSpore import).
"""
from __future__ import annotations

import importlib
import os
import sys
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence

__all__ = ["ModelSpec", "register_model", "get_model_spec", "registered_models", "resolve_model",
           "spec_of_model", "import_register_path"]


DEFAULT_TOKENIZER = "llama"     # the SentencePiece LlamaTokenizer (data/tokenizer.py)


@dataclass(frozen=True)
class ModelSpec:
    """A registered model family: its ``model.arch.type`` name, model class and config class;
    ``model_type``: the Hugging Face / MindFormers family name (e.g. ``"llama"``); ``tokenizer``: the
    kind of tokenizer its data is read with (``build_tokenizer(kind, file)``); ``layer_spec``: its
    spec function ``(config, layer_number) -> LayerSpec`` (None: the model class decides);
    ``state_dict_adapter``: its Hugging Face names <-> ours (``to_hf`` / ``from_hf`` on NumPy
    dicts, ``models.state_dict.StateDictAdapter``), None when it has none; ``hf_config``: its Hugging Face
    ``config.json`` mapping (``models.hf.config.HFConfigMapping``: the architectures it reads, config.json
    keys <-> model_config keys), None when it reads no Hugging Face folder."""
    name: str
    model_class: type
    config_class: type
    model_type: Optional[str] = None
    tokenizer: str = DEFAULT_TOKENIZER
    layer_spec: Optional[Callable[..., Any]] = None
    state_dict_adapter: Optional[Any] = None
    hf_config: Optional[Any] = None


_REGISTRY: Dict[str, ModelSpec] = {}
_MODEL_TYPES: Dict[str, str] = {}       # model_type -> registered name


def _qualified(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _public(cls: type) -> str:
    """The name users import ``cls`` by: its package's when the package re-exports it
    (``mindformers_core.models.llama.LlamaForCausalLM``), else where it is defined."""
    package = cls.__module__.rpartition(".")[0]
    if package and getattr(sys.modules.get(package), cls.__name__, None) is cls:
        return f"{package}.{cls.__qualname__}"
    return _qualified(cls)


def _same_definition(a: type, b: type) -> bool:
    """The same class, or the same definition executed again (a module re-imported or reloaded)."""
    return a is b or _qualified(a) == _qualified(b)


def register_model(name: Optional[str] = None, *, config_class: type, model_type: Optional[str] = None,
                   tokenizer: str = DEFAULT_TOKENIZER, layer_spec: Optional[Callable[..., Any]] = None,
                   state_dict_adapter: Optional[Any] = None, hf_config: Optional[Any] = None):
    """Class decorator: register the model class under ``name`` (default: the class's ``__name__``)
    with its ``config_class``. Registering the same class again is a no-op; registering another
    class under a taken name raises ``ValueError`` naming both. ``model_type`` (e.g. ``"llama"``) is
    the family name configs written in the Hugging Face style give instead of a class name;
    ``tokenizer``, ``layer_spec``, ``state_dict_adapter`` and ``hf_config`` as in :class:`ModelSpec`."""
    if name is not None and (not isinstance(name, str) or not name):
        raise ValueError(f"register_model: name must be a non-empty string or None, got {name!r}")
    if not isinstance(config_class, type):
        raise ValueError(f"register_model: config_class must be a class, got {config_class!r}")
    if not isinstance(tokenizer, str) or not tokenizer:
        raise ValueError(f"register_model: tokenizer must be a tokenizer kind (e.g. 'llama'), got {tokenizer!r}")
    if layer_spec is not None and not callable(layer_spec):
        raise ValueError(f"register_model: layer_spec must be a spec function (config, layer_number) -> "
                         f"LayerSpec, got {layer_spec!r}")
    if state_dict_adapter is not None and not all(callable(getattr(state_dict_adapter, m, None))
                                                  for m in ("to_hf", "from_hf")):
        raise ValueError(f"register_model: state_dict_adapter must have to_hf(state) and from_hf(hf_state), "
                         f"got {state_dict_adapter!r}")
    if hf_config is not None and not (getattr(hf_config, "architectures", None) and callable(getattr(hf_config, "read", None))
                                      and callable(getattr(hf_config, "write", None))):
        raise ValueError(f"register_model: hf_config must have architectures, read(hf_dict, source) and "
                         f"write(config) (models.hf.config.HFConfigMapping), got {hf_config!r}")

    def decorate(model_class: type) -> type:
        if not isinstance(model_class, type):
            raise ValueError(f"register_model: decorates a class, got {model_class!r}")
        key = name or model_class.__name__
        existing = _REGISTRY.get(key)
        if existing is not None and not _same_definition(existing.model_class, model_class):
            raise ValueError(f"register_model: the name {key!r} is already registered to "
                             f"{_public(existing.model_class)}; cannot register {_public(model_class)} "
                             f"under it (pick another name: @register_model('MyName', config_class=...))")
        if model_type is not None and _MODEL_TYPES.get(model_type, key) != key:
            raise ValueError(f"register_model: model_type {model_type!r} already names "
                             f"{_MODEL_TYPES[model_type]!r}; cannot give it to {key!r}")
        _REGISTRY[key] = ModelSpec(key, model_class, config_class, model_type, tokenizer, layer_spec,
                                   state_dict_adapter, hf_config)
        if model_type is not None:
            _MODEL_TYPES[model_type] = key
        return model_class

    return decorate


def registered_models() -> List[str]:
    """The registered names, sorted."""
    return sorted(_REGISTRY)


def spec_of_model(model) -> ModelSpec:
    """The ``ModelSpec`` whose model class built ``model`` (an instance or a class); ``ValueError`` if none."""
    cls = model if isinstance(model, type) else type(model)
    for spec in _REGISTRY.values():
        if spec.model_class is cls:
            return spec
    raise ValueError(f"{_qualified(cls)} is not a registered model class; registered: {registered_models()}")


def get_model_spec(name: str) -> ModelSpec:
    """The ``ModelSpec`` registered under ``name``; ``ValueError`` (with the registered names) if none."""
    spec = _REGISTRY.get(name)
    if spec is None:
        raise ValueError(f"model.arch.type = {name!r} is not a registered model; registered: "
                         f"{registered_models()}. User models register with @register_model "
                         f"(from mindformers_core.models import register_model) and are loaded with "
                         f"--register_path DIR (the directory of their code)")
    return spec


def resolve_model(arch_type: Optional[str] = None, architectures: Sequence[str] = (),
                  model_type: Optional[str] = None) -> ModelSpec:
    """The model a config names, in MindFormers' order of precedence: the class name
    (``model.arch.type``), else the first registered of ``architectures`` (Hugging Face style), else
    the family ``model_type``. ``ValueError`` naming what was given and what is registered."""
    for name in ([arch_type] if arch_type else []) + list(architectures or []):
        if name in _REGISTRY:
            return _REGISTRY[name]
    if model_type in _MODEL_TYPES:
        return _REGISTRY[_MODEL_TYPES[model_type]]
    given = {k: v for k, v in (("arch.type", arch_type), ("architectures", list(architectures or [])),
                               ("model_type", model_type)) if v}
    raise ValueError(f"model {given or 'type'}: no registered model; registered: {registered_models()} "
                     f"(model types {sorted(_MODEL_TYPES)}). User models register with @register_model and "
                     f"are loaded with --register_path DIR")


def _fail(path: str, reason: str):
    raise ValueError(f"--register_path {path!r}: {reason}")


def _import(path: str, directory: str, module_name: str):
    """Import ``module_name`` from ``directory`` (already on sys.path); reuse it when already imported
    from there, refuse when that name is another module's."""
    expected = os.path.realpath(os.path.join(directory, module_name))
    loaded = sys.modules.get(module_name)
    if loaded is None:
        try:
            loaded = importlib.import_module(module_name)
        except Exception as e:   # noqa: BLE001 -- any failure of user code becomes one clear error
            _fail(path, f"importing {module_name!r} from {directory} failed: {type(e).__name__}: {e}")
    origin = os.path.realpath(getattr(loaded, "__file__", None) or "")
    if origin not in (expected + ".py", os.path.join(expected, "__init__.py")):
        _fail(path, f"the module name {module_name!r} is already taken by {origin or loaded!r}; rename the "
                    f"package or module in the register path")


def import_register_path(path: str) -> List[str]:
    """MindFormers' ``--register_path``: import a directory of user model code so that its
    ``@register_model`` decorators run; returns the module names imported.

    A directory with ``__init__.py`` is imported as a package named by its basename (its parent goes
    on ``sys.path``); otherwise the directory goes on ``sys.path`` and each top-level ``*.py`` in it
    is imported, in sorted order. Importing the same path again changes nothing. ``ValueError``
    (naming ``--register_path``, the path and the reason) when the path is not a directory or an
    import fails."""
    if not isinstance(path, (str, os.PathLike)) or not str(path):
        _fail(str(path), "expected the path of a directory of model code")
    path = os.fspath(path)
    directory = os.path.abspath(path)
    if not os.path.isdir(directory):
        _fail(path, "not a directory" if os.path.exists(directory) else "no such directory")
    if os.path.isfile(os.path.join(directory, "__init__.py")):
        search_dir, names = os.path.dirname(directory), [os.path.basename(directory)]
    else:
        search_dir = directory
        names = sorted(f[:-3] for f in os.listdir(directory)
                       if f.endswith(".py") and os.path.isfile(os.path.join(directory, f)))
        if not names:
            _fail(path, "no __init__.py and no top-level *.py modules to import")
    for name in names:
        if not name.isidentifier():
            _fail(path, f"{name!r} is not a valid Python module name")
    if search_dir not in sys.path:
        sys.path.insert(0, search_dir)
    importlib.invalidate_caches()
    for name in names:
        _import(path, search_dir, name)
    return names
