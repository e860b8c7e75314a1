"""MsrunBatch.prelaunch: the launches start in a background thread, one worker count after the other, the
kwargs callables are made in the calling thread, and a job's results() waits for its launch (run_msrun is
replaced by a recorder: no workers start; the real launches are what every msrun test of the suite uses)."""
import threading
import time

import pytest

from mindformers_core.testing import batch as batch_module
from mindformers_core.testing.batch import MsrunBatch
from mindformers_core.testing.msrun import MsrunError


class Recorded(list):
    """The launches (nproc, job names, thread) and, in ``environments``, the base environment of each."""
    environments: list


@pytest.fixture
def launches(monkeypatch):
    seen, seen_env = Recorded(), []

    def fake_run_msrun(target, nproc, kwargs, timeout, env=None, base_env=None):
        seen.append((nproc, [name for name, _, _ in kwargs["jobs"]], threading.current_thread().name))
        seen_env.append(base_env)
        time.sleep(0.05)
        if nproc == 8:
            raise MsrunError("rank 3 failed")
        return [{name: (rank, kw) for name, _, kw in kwargs["jobs"]} for rank in range(nproc)]
    monkeypatch.setattr(batch_module, "run_msrun", fake_run_msrun)
    seen.environments = seen_env
    return seen


def test_prelaunch_runs_each_worker_count_once_in_the_background_most_workers_first(launches):
    made_in = []
    batch = MsrunBatch()
    a = batch.add("a", 2, "m:f", lambda: made_in.append(threading.current_thread().name) or {"x": 1}, group="g1")
    b = batch.add("b", 4, "m:f", {"y": 2}, group="g1")
    c = batch.add("c", 2, "m:f", {"z": 3}, group="g2")
    skipped = batch.add("d", 2, "m:f", {}, group="not selected")
    failing = batch.add("e", 8, "m:f", {}, group="g2")
    batch.select({"g1", "g2"})
    assert batch.prelaunch() == [8, 4, 2]
    assert made_in == [threading.current_thread().name]          # kwargs made here, not in the thread
    assert b.results() == [(r, {"y": 2}) for r in range(4)]       # waits for the 4-rank launch
    assert a.results()[1] == (1, {"x": 1}) and c.results()[0] == (0, {"z": 3})
    assert [(n, names) for n, names, _ in launches[:2]] == [(8, ["e"]), (4, ["b"])]
    assert [(n, names) for n, names, _ in launches] == [(8, ["e"]), (4, ["b"]), (2, ["a", "c"])]
    assert {thread for _, _, thread in launches} == {"msrun-batch-prelaunch"}
    with pytest.raises(MsrunError, match="(?s)job 'e'.*rank 3 failed"):
        failing.results()
    assert skipped.results() == [(0, {}), (1, {})]                # outside the selection: launched when asked
    assert [n for n, _, _ in launches] == [8, 4, 2, 2]
    assert batch.prelaunch() == []                                # nothing left to start


def test_background_launches_take_the_environment_of_their_start(launches, monkeypatch):
    """A test that sets a variable while a background launch is pending (MFC_FAULT, MFC_HOST_SUM) must not
    reach that launch's workers: the launches start from the environment of prelaunch()."""
    monkeypatch.delenv("MFC_PRELAUNCH_PROBE", raising=False)
    batch = MsrunBatch()
    gate = threading.Event()
    first = batch.add("slow", 4, "m:f", {}, group="g")
    later = batch.add("later", 2, "m:f", {}, group="g")
    original = batch_module.run_msrun

    def held(*args, **kwargs):
        if args[1] == 4:
            gate.wait(5)
        return original(*args, **kwargs)
    monkeypatch.setattr(batch_module, "run_msrun", held)
    batch.select({"g"})
    assert batch.prelaunch() == [4, 2]
    monkeypatch.setenv("MFC_PRELAUNCH_PROBE", "set by a test meanwhile")
    gate.set()
    first.results(), later.results()
    assert len(launches.environments) == 2
    assert all(env is not None and "MFC_PRELAUNCH_PROBE" not in env for env in launches.environments)
