"""Several msrun bodies in one launch: one cluster start-up for many jobs.

Every msrun launch pays a fixed start-up on each worker, whatever the body does: cluster
registration and the CPU collective library's start-up sync (measured on 2 cores: ~8 s before a
2-rank body starts, ~12 s for 4 ranks). A test suite with many bodies on the same worker count
registers them as jobs of one :class:`MsrunBatch` when its modules are imported; the first time a
job's result is asked for, every registered job of that worker count runs in one launch, one
after the other on every worker, and later requests are answered from that launch.

A job that raises on any rank ends the launch at once (its peers would otherwise block in their
next collective); every job of that launch then reports the failure with the job's name and each
rank's log.

``prelaunch()`` starts every worker count's launch at once, in a background thread (one launch after
the other, the most workers first), so that a test runner can run its one-process tests while the
workers run: the workers wait in their collectives much of the time (measured: 4 ranks on 2 cores kept
~1.3 cores busy), and the one-process tests fill that time; the launch that leaves the most of the
cores idle goes first. A job's ``results()`` then waits for its launch.
"""
from __future__ import annotations

import importlib
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple, Union

from .msrun import MsrunError, run_msrun

Kwargs = Union[Dict[str, Any], Callable[[], Dict[str, Any]]]
MAX_BATCH_TIMEOUT = 1800.0


def run_jobs(jobs: List[List[Any]]) -> Dict[str, Any]:
    """Worker side: ``jobs`` is ``[[name, "module:function", kwargs], ...]``; runs them in order
    and returns ``{name: result}`` plus ``"__seconds__": {name: wall seconds}``."""
    results: Dict[str, Any] = {}
    seconds: Dict[str, float] = {}
    cpu: Dict[str, float] = {}
    for name, target, kwargs in jobs:
        module_name, func_name = target.split(":")
        func = getattr(importlib.import_module(module_name), func_name)
        start, start_cpu = time.monotonic(), time.process_time()
        try:
            results[name] = func(**kwargs)
        except BaseException as e:
            raise RuntimeError(f"batched msrun job {name!r} ({target}) failed: {type(e).__name__}: {e}") from e
        seconds[name] = round(time.monotonic() - start, 2)
        cpu[name] = round(time.process_time() - start_cpu, 2)
        print(f"[batch] job {name} took {seconds[name]:.1f}s (this process' CPU: {cpu[name]:.1f}s)", flush=True)
    results["__seconds__"] = seconds
    results["__cpu__"] = cpu
    return results


@dataclass
class Job:
    """One body of a batch; ``results()`` returns its per-rank results (launching if needed)."""
    batch: "MsrunBatch"
    name: str
    nproc: int
    target: str
    kwargs: Kwargs
    timeout: float
    group: Optional[str]
    used_kwargs: Optional[Dict[str, Any]] = field(default=None)

    def results(self) -> List[Any]:
        return self.batch.results_of(self)


class MsrunBatch:
    """Jobs registered by name; one msrun launch per worker count (see the module doc).

    ``select(groups)`` limits launches to the jobs of those groups (the test runner passes the
    modules of the selected tests), so running one test file launches only that file's jobs."""

    def __init__(self, env: Optional[Dict[str, str]] = None):
        self.jobs: Dict[str, Job] = {}
        self.selected: Optional[set] = None
        self.env = env
        self._outcome: Dict[int, Union[List[Dict[str, Any]], MsrunError]] = {}
        self._running: Dict[int, threading.Event] = {}
        self.seconds: Dict[str, float] = {}
        self.cpu_seconds: Dict[str, float] = {}   # name -> CPU seconds of all its ranks' processes
        self.spans: Dict[int, Tuple[float, float]] = {}    # nproc -> (start, end) of its launch, time.monotonic()

    def add(self, name: str, nproc: int, target: str, kwargs: Optional[Kwargs] = None, timeout: float = 300.0,
            group: Optional[str] = None) -> Job:
        """Register a job. ``kwargs`` may be a callable, called when the launch starts (for paths
        made then); what it returned is kept in ``job.used_kwargs``."""
        if name in self.jobs:
            raise ValueError(f"MsrunBatch.add: a job named {name!r} is already registered")
        if ":" not in target:
            raise ValueError(f"MsrunBatch.add: target={target!r} must look like 'package.module:function'")
        if not isinstance(nproc, int) or nproc < 1:
            raise ValueError(f"MsrunBatch.add: nproc={nproc!r} must be a positive integer")
        job = Job(self, name, nproc, target, kwargs if kwargs is not None else {}, float(timeout), group)
        self.jobs[name] = job
        return job

    def select(self, groups: Iterable[str]) -> None:
        self.selected = set(groups)

    def _members(self, nproc: int, requested: Job) -> List[Job]:
        return [j for j in self.jobs.values() if j.nproc == nproc and
                (j is requested or self.selected is None or j.group in self.selected)]

    def results_of(self, job: Job) -> List[Any]:
        started = self._running.get(job.nproc)
        if started is not None:
            started.wait()                  # the prelaunch's run_msrun has a deadline of its own
        if job.nproc not in self._outcome or (not isinstance(self._outcome[job.nproc], MsrunError)
                                              and job.name not in self._outcome[job.nproc][0]):
            self._launch(job.nproc, job)
        outcome = self._outcome[job.nproc]
        if isinstance(outcome, MsrunError):
            raise MsrunError(f"job {job.name!r}: its batched launch on {job.nproc} ranks failed\n{outcome}")
        return [per_rank[job.name] for per_rank in outcome]

    def prelaunch(self) -> List[int]:
        """Start the selected jobs' launches in a background thread, largest worker count first; returns
        the worker counts started. Each job's kwargs are made here, in the calling thread (a kwargs
        callable may run MindSpore, which is not to be driven from two threads at once)."""
        counts = sorted({j.nproc for j in self.jobs.values()
                         if self.selected is None or j.group in self.selected} - set(self._outcome) - set(self._running),
                        reverse=True)
        plans = []
        for nproc in counts:
            plans.append((nproc, self._specs(self._members(nproc, None)), None))
            self._running[nproc] = threading.Event()
        # the environment of now: a launch starting later must not take what a test running meanwhile set
        # (e.g. a monkeypatched MFC_FAULT or MFC_HOST_SUM)
        environment = dict(os.environ)

        def run_all():
            for nproc, (specs, timeout), done in plans:
                try:
                    self._run(nproc, specs, timeout, done, environment)
                finally:
                    self._running.pop(nproc).set()
        if plans:
            threading.Thread(target=run_all, name="msrun-batch-prelaunch", daemon=True).start()
        return counts

    def _specs(self, members: List[Job]):
        specs = []
        for j in members:
            j.used_kwargs = j.kwargs() if callable(j.kwargs) else dict(j.kwargs)
            specs.append([j.name, j.target, j.used_kwargs])
        return specs, min(sum(j.timeout for j in members), MAX_BATCH_TIMEOUT)

    def _launch(self, nproc: int, requested: Job) -> None:
        done = self._outcome.get(nproc)
        members = [j for j in self._members(nproc, requested)
                   if not (isinstance(done, list) and j.name in done[0])]
        specs, timeout = self._specs(members)
        self._run(nproc, specs, timeout, done)

    def _run(self, nproc: int, specs, timeout: float, done, environment=None) -> None:
        start = time.monotonic()
        try:
            results = run_msrun(f"{__name__}:run_jobs", nproc, kwargs={"jobs": specs}, timeout=timeout,
                                env=self.env, base_env=environment)
        except MsrunError as e:
            self._outcome[nproc] = e
            return
        finally:
            self.spans[nproc] = (start, time.monotonic())
        for name, secs in results[0].get("__seconds__", {}).items():
            self.seconds[name] = secs
            self.cpu_seconds[name] = round(sum(r.get("__cpu__", {}).get(name, 0.0) for r in results), 2)
        if isinstance(done, list):    # a job outside the selection asked for later: merge
            for old, new in zip(done, results):
                old.update(new)
        else:
            self._outcome[nproc] = results
