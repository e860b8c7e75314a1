"""Asynchronous saving: the training loop goes on while a background thread writes the checkpoint.

``AsyncSaver.save`` takes host copies of the tensors (the only part on the caller's time), then a
thread on every rank writes that rank's files into ``step_<k>.tmp/`` exactly as a synchronous save
does; rank 0's thread waits — on the files, not on a collective (collectives from a second thread
would interleave with the training step's) — until every rank's JSON or failure marker is there,
then validates and publishes (rename, then tracker), as ``finalize_checkpoint`` always does. At most
one save is in flight: the next ``save`` (and ``wait``) first waits for the previous one. A failed
save (disk full, permissions, a rank's error, a timeout) publishes nothing: the previous checkpoint
stays latest, and the error is reported by ``wait``/``save`` through ``on_error``, never raised into
the training loop.
"""
from __future__ import annotations

import os
import threading
import time
from typing import Callable, Mapping, Optional

import numpy as np

from . import format as fmt
from .save import finalize_checkpoint, write_shards


def _host_copy(value) -> np.ndarray:
    if hasattr(value, "asnumpy"):
        value = value.asnumpy()
    return np.array(value, copy=True, order="C")


class AsyncSaver:
    """One rank's background saver. ``on_published(step)`` runs on rank 0 after a publish (e.g.
    pruning); ``on_error(message)`` reports a failed save."""

    def __init__(self, rank: int, world_size: int, timeout: float = 1800.0,
                 on_published: Optional[Callable[[int], None]] = None,
                 on_error: Callable[[str], None] = print):
        self.rank, self.world_size, self.timeout = rank, world_size, timeout
        self.on_published, self.on_error = on_published, on_error
        self._thread: Optional[threading.Thread] = None
        self.last_published: Optional[int] = None
        self.failures = 0

    def save(self, directory: str, step: int, params: Mapping, layouts: Optional[Mapping] = None, *,
             optimizer_state: Optional[Mapping[str, Mapping]] = None, data_state: Optional[dict] = None,
             trainer_state: Optional[dict] = None) -> None:
        self.wait()
        params = {k: _host_copy(v) for k, v in params.items()}
        optimizer_state = {s: {k: _host_copy(v) for k, v in m.items()} for s, m in (optimizer_state or {}).items()}
        kwargs = dict(layouts=dict(layouts or {}), optimizer_state=optimizer_state, data_state=data_state,
                      trainer_state=trainer_state)
        self._thread = threading.Thread(target=self._run, args=(directory, int(step), params, kwargs),
                                        name=f"async-save-step-{step}", daemon=True)
        self._thread.start()

    def wait(self) -> None:
        """Block until the save in flight (if any) is written and, on rank 0, published or refused."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    @property
    def in_flight(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _run(self, directory: str, step: int, params, kwargs) -> None:
        try:
            write_shards(directory, step, params, kwargs["layouts"], optimizer_state=kwargs["optimizer_state"],
                         data_state=kwargs["data_state"], trainer_state=kwargs["trainer_state"], rank=self.rank,
                         world_size=self.world_size)
        except Exception as e:     # noqa: BLE001 - every failure becomes a marker and a report
            self._mark_failed(directory, step, e)
            self.failures += 1
            self.on_error(f"async save of step {step} failed on rank {self.rank}: {type(e).__name__}: {e}; the "
                          "previous checkpoint stays latest")
            return
        if self.rank != 0:
            return
        try:
            self._wait_for_ranks(directory, step)
            finalize_checkpoint(directory, step, self.world_size)
        except Exception as e:     # noqa: BLE001
            self.failures += 1
            self.on_error(f"async save of step {step} not published: {type(e).__name__}: {e}; the previous "
                          "checkpoint stays latest")
            return
        self.last_published = step
        if self.on_published is not None:
            self.on_published(step)

    def _mark_failed(self, directory: str, step: int, error: BaseException) -> None:
        try:
            stage = fmt.staging_dir(directory, step)
            os.makedirs(stage, exist_ok=True)
            with open(os.path.join(stage, fmt.rank_stem(self.rank) + ".failed"), "w") as f:
                f.write(f"{type(error).__name__}: {error}")
        except OSError:
            pass

    def _wait_for_ranks(self, directory: str, step: int) -> None:
        """Every rank's ``rank_<r>.json`` (written last) or ``.failed`` marker in the staging directory."""
        stage = fmt.staging_dir(directory, step)
        deadline = time.monotonic() + self.timeout
        while True:
            missing = [r for r in range(self.world_size)
                       if not any(os.path.exists(os.path.join(stage, fmt.rank_stem(r) + ext))
                                  for ext in (".json", ".failed"))]
            if not missing:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"ranks {missing} wrote nothing into {stage} within {self.timeout:.0f} s")
            time.sleep(0.05)
