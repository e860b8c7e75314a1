"""The model registry (``mindformers_core.models``): register and look up, the errors, MindFormers'
``--register_path`` (a package or a directory of modules), the built-in Llama and the research
example ``research/gpt_ln`` built through the registry, and one 2-step run of that example through
the CLI."""
import dataclasses
import json
import math
import os
import sys

import numpy as np
import pytest

import mindspore as ms
from mindspore import Tensor

from mindformers_core.models import (LlamaConfig, LlamaForCausalLM, ModelSpec, get_model_spec, import_register_path,
                                     register_model, registered_models)
from mindformers_core.models import registry
from mindformers_core.transformer import GPTModel, TransformerConfig

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GPT_LN = os.path.join(ROOT, "research", "gpt_ln")
TINY = dict(num_layers=2, hidden_size=32, num_heads=4, n_kv_heads=2, vocab_size=64, seq_length=16)
B = 2


@pytest.fixture
def fresh_registry(monkeypatch):
    """A copy of the registry for the test: what it registers is gone afterwards."""
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    monkeypatch.setattr(registry, "_MODEL_TYPES", dict(registry._MODEL_TYPES))


@pytest.fixture
def user_modules(monkeypatch):
    """sys.path restored after the test; the listed module names dropped from sys.modules."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    names = []
    yield names
    for name in names:
        sys.modules.pop(name, None)


def write(path, text=""):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def user_model(class_name, name=None):
    """Source of a module that registers a trivial model class."""
    label = "" if name is None else repr(name)
    return ("from mindformers_core.models import register_model\n\n"
            "class UserConfig:\n    pass\n\n"
            f"@register_model({label}{', ' if label else ''}config_class=UserConfig)\n"
            f"class {class_name}:\n    pass\n")


def finite_loss(spec, model_config, parallel_config=None, **build):
    cfg = spec.config_class.from_model_config(model_config, parallel_config)
    assert isinstance(cfg, TransformerConfig)
    ms.set_seed(5)
    model = spec.model_class(cfg, **build)
    assert isinstance(model, GPTModel)
    rng = np.random.RandomState(0)
    ids = Tensor(rng.randint(0, cfg.vocab_size, (B, cfg.seq_length)), ms.int32)
    labels = Tensor(rng.randint(0, cfg.vocab_size, (B, cfg.seq_length)), ms.int32)
    loss = float(model(ids, labels).asnumpy())
    assert math.isfinite(loss) and loss > 0, loss
    assert model(ids).shape == (B, cfg.seq_length, cfg.vocab_size)
    return cfg, model, loss


# ---- register / look up --------------------------------------------------------------------------------


def test_register_and_look_up(fresh_registry):
    class Cfg:
        pass

    @register_model(config_class=Cfg)
    class MyModel:
        pass

    @register_model("Other", config_class=Cfg)
    class Named:
        pass

    assert MyModel.__name__ == "MyModel" and Named.__name__ == "Named"   # the decorator returns the class
    assert get_model_spec("MyModel") == ModelSpec("MyModel", MyModel, Cfg)
    assert get_model_spec("Other").model_class is Named
    names = registered_models()
    assert names == sorted(names) and {"MyModel", "Other", "LlamaForCausalLM"} <= set(names)
    with pytest.raises(dataclasses.FrozenInstanceError):
        get_model_spec("MyModel").name = "x"
    register_model(config_class=Cfg)(MyModel)   # the same class again: no-op
    assert get_model_spec("MyModel").model_class is MyModel


def test_duplicate_name_names_both_classes(fresh_registry):
    class Cfg:
        pass

    @register_model("Dup", config_class=Cfg)
    class First:
        pass

    class Second:
        pass

    with pytest.raises(ValueError) as err:
        register_model("Dup", config_class=Cfg)(Second)
    assert "'Dup'" in str(err.value) and "First" in str(err.value) and "Second" in str(err.value)
    assert get_model_spec("Dup").model_class is First
    with pytest.raises(ValueError, match="already registered"):
        register_model(config_class=LlamaConfig)(type("LlamaForCausalLM", (), {}))


def test_unknown_name_error_says_how_to_register():
    with pytest.raises(ValueError) as err:
        get_model_spec("NoSuchModel")
    msg = str(err.value)
    assert not isinstance(err.value, KeyError)
    assert "'NoSuchModel'" in msg and "LlamaForCausalLM" in msg
    assert "@register_model" in msg and "--register_path" in msg


def test_resolve_by_class_name_architectures_or_model_type(fresh_registry):
    from mindformers_core.models import LlamaConfig, resolve_model

    @register_model("TinyFamilyForCausalLM", config_class=LlamaConfig, model_type="tiny_family")
    class TinyFamilyForCausalLM:
        pass
    assert resolve_model("TinyFamilyForCausalLM").model_class is TinyFamilyForCausalLM
    assert resolve_model(None, ["Unknown", "TinyFamilyForCausalLM"]).name == "TinyFamilyForCausalLM"
    assert resolve_model(model_type="tiny_family").model_class is TinyFamilyForCausalLM
    assert resolve_model(model_type="llama").name == "LlamaForCausalLM"
    assert resolve_model("LlamaForCausalLM", model_type="tiny_family").name == "LlamaForCausalLM"  # class first
    with pytest.raises(ValueError, match=r"'model_type': 'gpt9'.*registered: \[.*'LlamaForCausalLM'.*llama"):
        resolve_model(model_type="gpt9")
    with pytest.raises(ValueError, match="model_type 'llama' already names 'LlamaForCausalLM'"):
        register_model("OtherLlama", config_class=LlamaConfig, model_type="llama")(type("OtherLlama", (), {}))


# ---- --register_path ---------------------------------------------------------------------------------


def test_register_path_package(tmp_path, fresh_registry, user_modules):
    pkg = tmp_path / "mfc_user_pkg"
    write(pkg / "__init__.py", "from .model import MfcPkgModel\n")
    write(pkg / "model.py", user_model("MfcPkgModel"))
    user_modules += ["mfc_user_pkg", "mfc_user_pkg.model"]
    assert import_register_path(str(pkg)) == ["mfc_user_pkg"]
    spec = get_model_spec("MfcPkgModel")
    assert spec.model_class is sys.modules["mfc_user_pkg.model"].MfcPkgModel
    assert str(tmp_path) in sys.path
    before = dict(registry._REGISTRY)
    assert import_register_path(str(pkg)) == ["mfc_user_pkg"]     # idempotent
    assert registry._REGISTRY == before and sys.path.count(str(tmp_path)) == 1
    for name in user_modules:                                       # the same code imported afresh
        sys.modules.pop(name)
    assert import_register_path(str(pkg)) == ["mfc_user_pkg"]
    assert get_model_spec("MfcPkgModel").model_class is sys.modules["mfc_user_pkg.model"].MfcPkgModel


def test_register_path_directory_of_modules(tmp_path, fresh_registry, user_modules):
    plain = tmp_path / "plain"
    write(plain / "mfc_b_mod.py", user_model("MfcB"))
    write(plain / "mfc_a_mod.py", user_model("MfcA", name="MfcAlias"))
    write(plain / "notes.txt", "not code")
    write(plain / "sub" / "mfc_c_mod.py", "raise RuntimeError('sub-directories are not imported')\n")
    user_modules += ["mfc_a_mod", "mfc_b_mod"]
    assert import_register_path(str(plain)) == ["mfc_a_mod", "mfc_b_mod"]
    assert {"MfcAlias", "MfcB"} <= set(registered_models()) and "MfcA" not in registered_models()
    assert "mfc_c_mod" not in sys.modules and str(plain) in sys.path
    assert import_register_path(str(plain)) == ["mfc_a_mod", "mfc_b_mod"]


def test_register_path_errors(tmp_path, fresh_registry, user_modules):
    missing = tmp_path / "missing"
    with pytest.raises(ValueError, match=r"--register_path .*missing.*no such directory"):
        import_register_path(str(missing))
    a_file = write(tmp_path / "model.py", "x = 1\n")
    with pytest.raises(ValueError, match=r"--register_path .*model\.py.*not a directory"):
        import_register_path(str(a_file))
    write(tmp_path / "mfc_broken" / "__init__.py", "raise RuntimeError('boom in user code')\n")
    user_modules.append("mfc_broken")
    with pytest.raises(ValueError) as err:
        import_register_path(str(tmp_path / "mfc_broken"))
    assert "--register_path" in str(err.value) and "mfc_broken" in str(err.value) \
        and "RuntimeError: boom in user code" in str(err.value)
    write(tmp_path / "dup" / "mfc_dup_mod.py", user_model("LlamaForCausalLM"))
    user_modules.append("mfc_dup_mod")
    with pytest.raises(ValueError, match="already registered to mindformers_core.models.llama.LlamaForCausalLM"):
        import_register_path(str(tmp_path / "dup"))
    write(tmp_path / "json" / "__init__.py", "")   # a name another module already has
    with pytest.raises(ValueError, match="'json' is already taken"):
        import_register_path(str(tmp_path / "json"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no __init__.py and no top-level"):
        import_register_path(str(tmp_path / "empty"))


# ---- models built through the registry ----------------------------------------------------------------


def test_llama_is_registered_and_trains_a_step():
    spec = get_model_spec("LlamaForCausalLM")
    assert spec.model_class is LlamaForCausalLM and spec.config_class is LlamaConfig
    cfg, model, _ = finite_loss(spec, dict(TINY, hidden_act="silu"))
    assert cfg.normalization == "RMSNorm" and cfg.activation == "swiglu" and len(model.decoder.layers) == 2
    split = spec.config_class.from_model_config(dict(TINY, num_layers=3, offset=[1, 0]), {"pipeline_stage": 2})
    assert spec.model_class(split, pp_rank=1).decoder.layer_numbers == [3]


def test_research_gpt_ln_registers_through_register_path():
    from mindformers_core.training import load_config
    assert import_register_path(GPT_LN) == ["gpt_ln"]
    spec = get_model_spec("GPTLNForCausalLM")
    assert spec.config_class.__name__ == "GPTLNConfig" and issubclass(spec.model_class, GPTModel)
    c = load_config(os.path.join(GPT_LN, "gpt_ln_tiny.yaml"))
    assert c.model.arch.type == "GPTLNForCausalLM"
    mc = dict(c.model.model_config.to_dict(), num_layers=2, hidden_size=32, ffn_hidden_size=64, vocab_size=64,
              seq_length=16)
    cfg, model, _ = finite_loss(spec, mc, c.parallel_config.to_dict())
    assert (cfg.normalization, cfg.activation, cfg.add_bias_linear) == ("LayerNorm", "gelu", True)
    names = [n for n, _ in model.parameters_and_names()]
    assert "decoder.layers.0.mlp.linear_fc1.bias" in names and not any("gate" in n for n in names)
    assert spec.config_class.from_model_config(TINY).activation == "gelu"   # hidden_act absent: gelu
    last = spec.model_class(spec.config_class.from_model_config(TINY, {"pipeline_stage": 2}), pp_rank=1)
    assert not last.pre_process and last.post_process
    assert import_register_path(GPT_LN) == ["gpt_ln"]                        # again: nothing changes
    assert get_model_spec("GPTLNForCausalLM") is spec


# ---- through the CLI ---------------------------------------------------------------------------------------

SMALL = ["--model.model_config.num_layers", "2", "--model.model_config.hidden_size", "64",
         "--model.model_config.ffn_hidden_size", "128", "--model.model_config.seq_length", "32",
         "--model.model_config.vocab_size", "384"]   # as tests/test_wheel.py


def test_cli_trains_a_register_path_model(tmp_path, monkeypatch):
    """End to end through the CLI: ``--register_path research/gpt_ln`` then 2 training steps."""
    from mindformers_core.training.cli import main
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(sys, "path", list(sys.path))
    out = tmp_path / "out"
    assert main(["--register_path", "research/gpt_ln", "--config", "research/gpt_ln/gpt_ln_tiny.yaml",
                 "--output_dir", str(out), "--runner_config.max_steps", "2", "--lr_schedule.total_steps", "2",
                 *SMALL]) == 0
    with open(out / "loss.jsonl") as f:
        losses = [json.loads(line) for line in f if line.strip()]
    assert len(losses) == 2 and all(math.isfinite(r["loss"]) for r in losses), losses
