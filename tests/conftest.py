import os
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from mindformers_core.testing.jit_guard import install_guard  # noqa: E402

_GUARD = install_guard()

# the one-process tests run eager ops as the trainer and the msrun workers do: on CPU in the calling thread,
# not through MindSpore's spinning dispatch queue (MFC_PYNATIVE_SYNC=0 keeps it; docs/config.md, docs/testing.md)
from mindformers_core.training.cli import pynative_sync  # noqa: E402

pynative_sync({})


def pytest_collection_modifyitems(session, config, items):
    """Batched msrun bodies launch only for the modules of the tests that will run. The launches start now,
    in the background (MFC_BATCH_PRELAUNCH=0 keeps them until a test asks), and the tests are ordered so that
    the one-process ones run meanwhile: first the tests that start no workers, then the modules with launches
    of their own marked ``beside_batch`` (their deadlines allow a batch alongside: they fill the cores the
    batch's waiting workers leave idle), then the modules waiting for the batched launches, last the other
    modules launching workers of their own (their deadlines are set for a machine not also running a batch)."""
    from tests.msrun_batch import BATCH, REFERENCES, STARTERS
    modules = {item.module.__name__ for item in items if getattr(item, "module", None) is not None}
    BATCH.select(modules)
    batched = {j.group for j in BATCH.jobs.values()}
    # the smallest worker count among a module's jobs: the background launches go most workers first, so a
    # module needing only the 8- and 4-rank launches can run (its one-process references too) while the
    # 2-rank launch is still going
    needs = {}
    for j in BATCH.jobs.values():
        needs[j.group] = min(needs.get(j.group, j.nproc), j.nproc)

    def phase(item):
        if item.get_closest_marker("alone") is not None:    # timings: not while the batched launches take the cores
            return 2
        if item.get_closest_marker("msrun") is None:       # (test_docs' one-process blocks too)
            return 0
        if item.get_closest_marker("beside_batch") is not None:     # (a batched module's own launches too)
            return 0.5
        return 1 if getattr(getattr(item, "module", None), "__name__", "") in batched else 2

    def order(item):
        p = phase(item)
        return (p, -needs.get(getattr(getattr(item, "module", None), "__name__", ""), 0) if p == 1 else 0)
    items.sort(key=order)               # stable: each module keeps its tests' order
    _PHASES.update({item.nodeid: phase(item) for item in items})
    _PHASE_START["collected"] = time.monotonic()
    ordered = list(dict.fromkeys(item.module.__name__ for item in items if phase(item) == 1))
    _AHEAD.extend((name, fn) for name in ordered for fn in REFERENCES.get(name, ()))
    if os.environ.get("MFC_BATCH_PRELAUNCH", "1") != "0" and any(phase(i) == 0 for i in items):
        BATCH.prelaunch()
        for name in modules:
            for start in STARTERS.get(name, ()):
                start()


_PHASES = {}            # test id -> phase (0 no workers, 0.5 own launches beside the batch, 1 waiting for the
                        # batched launches, 2 own launches alone)
_PHASE_START = {}       # "collected" / phase -> time.monotonic() of its first test
_PHASE_NAMES = {0: "tests starting no workers", 0.5: "tests launching their own beside the batch",
                1: "tests of the batched launches", 2: "tests launching their own"}


def pytest_runtest_logstart(nodeid, location):
    _PHASE_START.setdefault(_PHASES.get(nodeid, 0), time.monotonic())


_AHEAD = []             # (module, cached reference) of the modules waiting for the batched launches, in their order
_AHEAD_SECONDS = {}     # module -> seconds its references took ahead (or the error they raised)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """Before the first test waiting for the batched launches: every such module's one-process references
    (tests/msrun_batch.py ``computed_ahead``), while the last launch still runs, so that after it only the
    comparisons remain. A reference that fails here is not cached: the module's own call raises it again."""
    if _PHASES.get(item.nodeid) != 1 or not _AHEAD:
        return
    todo = list(_AHEAD)
    _AHEAD.clear()
    for name, fn in todo:
        start = time.monotonic()
        _GUARD.seen.clear()
        try:
            fn()
        except KeyboardInterrupt:
            raise
        except BaseException as e:              # noqa: BLE001  (reported by the module's own call)
            _AHEAD_SECONDS[name] = f"{type(e).__name__} (raised again by the module's test)"
            continue
        if _GUARD.seen:         # a jit recompile: dropped, so that the module's own call meets the guard
            fn.cache_clear()
            _GUARD.seen.clear()
            _AHEAD_SECONDS[name] = "a jit function recompiled (computed again by the module's test)"
            continue
        if not isinstance(_AHEAD_SECONDS.get(name), str):
            _AHEAD_SECONDS[name] = _AHEAD_SECONDS.get(name, 0.0) + time.monotonic() - start


@pytest.fixture(autouse=True)
def no_jit_recompiles_per_call():
    """A jit function handed a tuple of Tensors recompiles at every call: fail the test."""
    _GUARD.seen.clear()
    yield
    if _GUARD.seen:
        pytest.fail(_GUARD.report())


_MODULE_SECONDS = {}     # module file -> seconds of its tests' setup, call and teardown in this process


def pytest_runtest_logreport(report):
    path = report.nodeid.split("::")[0]
    _MODULE_SECONDS[path] = _MODULE_SECONDS.get(path, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """Batched msrun jobs run inside one launch per worker count, so pytest's --durations cannot
    see them: list each job's wall seconds (rank 0) so the slow ones are visible in every run; and the
    modules whose tests took the most wall time here (a module's many short tests add up unseen by --durations)."""
    from tests.msrun_batch import BATCH
    if not BATCH.seconds:
        return
    write_timeline(terminalreporter, BATCH)
    terminalreporter.section("modules by wall seconds of their tests in this process (incl. waiting for launches)")
    for path, secs in sorted(_MODULE_SECONDS.items(), key=lambda kv: -kv[1])[:20]:
        terminalreporter.write_line(f"  {secs:7.1f}s  {path}")
    if _AHEAD_SECONDS:
        terminalreporter.section("one-process references computed ahead (seconds)")
        for name, secs in _AHEAD_SECONDS.items():
            terminalreporter.write_line(f"  {secs:7.1f}s  {name}" if not isinstance(secs, str) else f"  {name}: {secs}")
    by_nproc = {}
    for name, secs in BATCH.seconds.items():
        cpu = BATCH.cpu_seconds.get(name, 0.0)
        by_nproc.setdefault(BATCH.jobs[name].nproc if name in BATCH.jobs else 0, []).append((secs, cpu, name))
    # the suite is CPU-bound (both cores busy throughout): a job's CPU seconds, summed over its ranks, are what
    # it costs the suite
    terminalreporter.section("batched msrun jobs (wall seconds on rank 0, CPU seconds of all ranks)")
    for nproc in sorted(by_nproc):
        rows = sorted(by_nproc[nproc], reverse=True)
        terminalreporter.write_line(f"{nproc} ranks: {sum(r[0] for r in rows):.0f} s, {sum(r[1] for r in rows):.0f} "
                                    f"CPU s in {len(rows)} jobs")
        for secs, cpu, name in rows:
            terminalreporter.write_line(f"  {secs:7.1f}s  {cpu:7.1f} CPU s  {name}")


def write_timeline(terminalreporter, batch):
    """When each phase of tests and each background launch ran, in seconds since collection: where the
    suite's wall time goes (the launches overlap the tests of phase 0)."""
    zero = _PHASE_START.get("collected")
    if zero is None:
        return
    now = time.monotonic()
    starts = sorted((t, p) for p, t in _PHASE_START.items() if p != "collected")
    terminalreporter.section("suite timeline (seconds since collection)")
    for i, (t, p) in enumerate(starts):
        end = starts[i + 1][0] if i + 1 < len(starts) else now
        terminalreporter.write_line(f"  {t - zero:7.0f} - {end - zero:7.0f}  {_PHASE_NAMES.get(p, p)}")
    for nproc, (start, end) in sorted(batch.spans.items(), key=lambda kv: kv[1]):
        terminalreporter.write_line(f"  {start - zero:7.0f} - {end - zero:7.0f}  batched launch on {nproc} ranks")
