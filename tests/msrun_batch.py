"""The suite's one :class:`MsrunBatch`: test modules register their msrun bodies here at import,
and each worker count's bodies run in one launch (see mindformers_core/testing/batch.py).
``tests/conftest.py`` limits launches to the modules of the selected tests.

Two more registries let a module's work move off the suite's critical path (tests/conftest.py, docs/testing.md):
``computed_ahead`` marks a module's one-process reference, computed before the modules waiting for the batched
launches run (while the last launch still goes, instead of alone after it); ``background`` marks a starter of
a module's own launches, called at collection so they run in a thread beside the one-process tests."""
import atexit
import functools
import threading
from concurrent.futures import Future

from mindformers_core.testing.batch import MsrunBatch
from mindformers_core.testing.msrun import kill_tree

BATCH = MsrunBatch()
REFERENCES = {}         # module __name__ -> [cached zero-argument reference functions]
STARTERS = {}           # module __name__ -> [zero-argument functions starting background launches]


def job(name, nproc, target, kwargs=None, timeout=300.0, group=None):
    """Register a body; ``group`` is the registering test module's ``__name__``."""
    return BATCH.add(name, nproc, target, kwargs, timeout, group)


def computed_ahead(fn):
    """A module's one-process reference: a zero-argument function, cached (computed once per process, a
    failure is not cached: the module's own call raises it where it belongs)."""
    cached = functools.lru_cache(maxsize=None)(fn)
    REFERENCES.setdefault(fn.__module__, []).append(cached)
    return cached


def background(fn):
    """A module's starter of background launches: a zero-argument function, cached, that starts its launches
    in a thread and returns handles (futures) the module's tests wait on; called at collection when the suite
    prelaunches, else by the first test asking."""
    cached = functools.lru_cache(maxsize=None)(fn)
    STARTERS.setdefault(fn.__module__, []).append(cached)
    return cached


LIVE_LAUNCHERS = set()  # pids of launcher processes a background thread still waits on: killed at exit


@atexit.register
def _kill_live_launchers():
    for pid in list(LIVE_LAUNCHERS):
        kill_tree(pid)


def settle(future: Future, fn, *args) -> None:
    """``fn(*args)``'s result, or the exception it raised, into ``future`` (a test's ``result()`` raises it again)."""
    try:
        future.set_result(fn(*args))
    except BaseException as e:          # noqa: BLE001
        future.set_exception(e)


def in_background(name: str, fn, *args) -> Future:
    """``fn(*args)`` in a daemon thread named ``name``; its future."""
    future = Future()
    threading.Thread(target=settle, args=(future, fn, *args), name=name, daemon=True).start()
    return future
