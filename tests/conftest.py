import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from mindformers_core.testing.jit_guard import install_guard  # noqa: E402

_GUARD = install_guard()


def pytest_collection_modifyitems(session, config, items):
    """Batched msrun bodies launch only for the modules of the tests that will run."""
    from tests.msrun_batch import BATCH
    BATCH.select({item.module.__name__ for item in items if getattr(item, "module", None) is not None})


@pytest.fixture(autouse=True)
def no_jit_recompiles_per_call():
    """A jit function handed a tuple of Tensors recompiles at every call: fail the test."""
    _GUARD.seen.clear()
    yield
    if _GUARD.seen:
        pytest.fail(_GUARD.report())
