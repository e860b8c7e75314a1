"""The suite's one :class:`MsrunBatch`: test modules register their msrun bodies here at import,
and each worker count's bodies run in one launch (see mindformers_core/testing/batch.py).
``tests/conftest.py`` limits launches to the modules of the selected tests."""
from mindformers_core.testing.batch import MsrunBatch

BATCH = MsrunBatch()


def job(name, nproc, target, kwargs=None, timeout=300.0, group=None):
    """Register a body; ``group`` is the registering test module's ``__name__``."""
    return BATCH.add(name, nproc, target, kwargs, timeout, group)
