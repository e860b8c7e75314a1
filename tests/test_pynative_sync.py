"""The trainer's eager dispatch setting (``context.pynative_synchronize`` / ``MFC_PYNATIVE_SYNC``):
default by device, precedence, named errors before any process group."""
import pytest

from mindformers_core.training import ConfigError
from mindformers_core.training.cli import PYNATIVE_SYNC_ENV, pynative_sync_setting
from tests.test_cpu_threads import config


def test_default_is_synchronous_on_cpu_only(monkeypatch):
    monkeypatch.delenv("MFC_DEVICE_TARGET", raising=False)
    assert config().context.pynative_synchronize is None
    assert pynative_sync_setting(config(), environ={}) == (True, "default on CPU")
    assert pynative_sync_setting(config("context.device_target=Ascend"), environ={}) == (False, "default on ASCEND")


def test_yaml_key_and_environment_override_in_that_order():
    cfg = config("context.pynative_synchronize=false")
    assert pynative_sync_setting(cfg, environ={}) == (False, "context.pynative_synchronize")
    assert pynative_sync_setting(cfg, environ={PYNATIVE_SYNC_ENV: "1"}) == (True, PYNATIVE_SYNC_ENV)
    assert pynative_sync_setting(config(), environ={PYNATIVE_SYNC_ENV: "0"}) == (False, PYNATIVE_SYNC_ENV)


@pytest.mark.parametrize("bad", ["2", "yes", "true", "-1"])
def test_bad_environment_value_is_named(bad):
    with pytest.raises(ConfigError) as info:
        pynative_sync_setting(config(), environ={PYNATIVE_SYNC_ENV: bad})
    assert f"{PYNATIVE_SYNC_ENV}={bad!r}" in str(info.value) and "must be 0" in str(info.value)


def test_bad_yaml_value_is_named_by_the_schema():
    with pytest.raises(ConfigError) as info:
        config("context.pynative_synchronize=3")
    assert "context.pynative_synchronize" in str(info.value)
