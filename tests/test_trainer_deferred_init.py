"""The trainer does not draw the random weights a Hugging Face folder overwrites (``load_checkpoint`` is a model
folder: ``model_builder.build_model(hf_folder=...)`` builds under ``transformer.init.deferred_init`` and draws,
before sharding, only what the folder lacks; ``Trainer.setup`` loads the folder at once). Each case runs twice on
one process, deferred and with the deferral switched off (the old path: every weight drawn, then the folder
loaded), and the two must agree exactly: the weights after the load, the first step's loss, and whatever the
folder does not hold (LoRA's adapters, DeepSeek-V3's MTP layers absent from the folder) drawn as before."""
import os

import numpy as np
import pytest

from mindformers_core.training import trainer as trainer_module
from mindformers_core.transformer import init
from tests.test_hf_msrun import argv, hf_yaml
from tests.test_lora import PET, folder_state, lora_yaml
from tests.test_trainer import config_of

HF = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "hf")
ONE = ["--runner_config.max_steps", 1, "--lr_schedule.warmup_steps", 0, "--callbacks", "[{type: MFLossMonitor}]"]


def _run(monkeypatch, config, out, *extra, defer=True):
    """Setup and the load, then one step: (the keys ``normal_array`` drew during setup + load, every parameter
    after the load by name, the first step's loss, the trainer)."""
    drawn, real = [], init.normal_array

    def counting(key, shape, std):
        drawn.append(key)
        return real(key, shape, std)
    with monkeypatch.context() as m:
        m.setattr(init, "normal_array", counting)
        if not defer:            # the old path: no folder known at build, restore() loads it
            m.setattr(trainer_module.Trainer, "_hf_folder", lambda self: None)
        trainer = trainer_module.Trainer(config_of(argv(config, out, *ONE, *extra)))
        trainer.setup()
        assert trainer.restore() == 0
        keys = list(drawn)
        weights = {p.name: p.asnumpy().copy() for c in trainer.built.chunks for p in c.get_parameters()}
        [record] = trainer.train()
    return keys, weights, record["loss"], trainer


def _same(a, b):
    assert sorted(a) == sorted(b)
    for name in a:
        assert np.array_equal(a[name], b[name]), name


def test_loaded_weights_are_not_drawn_and_the_run_is_unchanged(tmp_path, monkeypatch):
    config = hf_yaml(str(tmp_path), os.path.join(HF, "qwen3"))
    keys, weights, loss, trainer = _run(monkeypatch, config, tmp_path / "deferred")
    old_keys, old_weights, old_loss, _ = _run(monkeypatch, config, tmp_path / "drawn", defer=False)
    assert keys == [] and len(old_keys) >= len(weights) // 2       # nothing drawn (the folder holds every weight)
    _same(weights, old_weights)
    want = folder_state()
    assert sorted(want) == sorted(weights) and all(np.array_equal(weights[n], want[n]) for n in want)
    assert loss == old_loss


def test_lora_adapters_are_drawn_as_before(tmp_path, monkeypatch):
    config = lora_yaml(str(tmp_path), PET)
    keys, weights, loss, trainer = _run(monkeypatch, config, tmp_path / "deferred")
    _, old_weights, old_loss, _ = _run(monkeypatch, config, tmp_path / "drawn", defer=False)
    # the adapters only (built after the deferral, as before: _AdapterLinear's own draw, then A's keyed one)
    assert keys and not [k for k in keys if "lora" not in k and not k.startswith("_AdapterLinear:")]
    _same(weights, old_weights)
    a = [n for n in weights if n.endswith("lora_a.weight")]
    b = [n for n in weights if n.endswith("lora_b.weight")]
    assert len(a) == len(b) == 8
    assert all(np.abs(weights[n]).max() > 0 for n in a) and all(not weights[n].any() for n in b)
    want = folder_state()
    assert all(np.array_equal(weights[n], want[n]) for n in want)
    assert loss == old_loss


def test_mtp_layers_the_folder_lacks_are_drawn_as_before(tmp_path, monkeypatch, capsys):
    config = hf_yaml(str(tmp_path), os.path.join(HF, "deepseek_v3"))
    mtp = ["--model.model_config.mtp_depth", 1]
    keys, weights, loss, _ = _run(monkeypatch, config, tmp_path / "deferred", *mtp)
    _, old_weights, old_loss, _ = _run(monkeypatch, config, tmp_path / "drawn", *mtp, defer=False)
    assert keys and all(k.startswith("mtp.") for k in keys), keys      # the MTP depth's, nothing else
    assert "holds no multi-token prediction layers" in capsys.readouterr().out
    _same(weights, old_weights)
    assert loss == old_loss


def test_predict_loads_the_folder_in_setup(tmp_path, monkeypatch):
    config = hf_yaml(str(tmp_path), os.path.join(HF, "qwen3"))
    drawn, real = [], init.normal_array
    monkeypatch.setattr(init, "normal_array", lambda key, shape, std: drawn.append(key) or real(key, shape, std))
    trainer = trainer_module.Trainer(config_of(argv(config, tmp_path / "p", "--run_mode", "predict")))
    trainer.setup()                    # no restore(): the weights are the folder's already
    want = folder_state()
    got = {p.name: p.asnumpy() for p in trainer.model.get_parameters()}
    assert drawn == [] and all(np.array_equal(got[n], want[n]) for n in want)
    assert trainer.restore() == 0


def test_lora_on_a_folder_lacking_base_weights_is_refused_before_any_process_group(tmp_path, monkeypatch):
    """LoRA freezes the base: the DeepSeek-V3 folder holds no MTP layer, so with mtp_depth 1 the preflight names the
    missing parameters (and what to change) before distributed init; with mtp_depth 0 the same LoRA run starts."""
    from mindformers_core.training.config import ConfigError
    config = hf_yaml(str(tmp_path), os.path.join(HF, "deepseek_v3"))
    lora = ["--model.model_config.pet_config", "{pet_type: lora, lora_rank: 4, lora_alpha: 8, "
            "target_modules: '.*o_proj'}"]
    with pytest.raises(ConfigError) as e:
        trainer_module.Trainer(config_of(argv(config, tmp_path / "mtp", *ONE, *lora,
                                              "--model.model_config.mtp_depth", 1)))
    text = str(e.value)
    assert "LoRA freezes the base model" in text and "mtp.layers." in text and "mtp_depth to 0" in text, text
    trainer = trainer_module.Trainer(config_of(argv(config, tmp_path / "plain", *ONE, *lora,
                                                    "--model.model_config.mtp_depth", 0)))
    assert trainer._hf_folder() == os.path.join(HF, "deepseek_v3")
