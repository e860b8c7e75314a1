"""``RuntimeOptions``: the pipeline runtime's settings from the environment, read in one place.

``RuntimeOptions.from_env()`` reads the ``MFC_PIPELINE_*`` variables once; ``PipelineStage`` and
``PipelineRuntime`` take ``options=`` (default: read when they are built), so a program or a test
sets them by argument instead of by environment.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping, Optional

CAPTURE_MODES = ("", "bytecode")


@dataclass(frozen=True)
class RuntimeOptions:
    """``recompute`` (``MFC_PIPELINE_RECOMPUTE=1``): every stage built without ``recompute=`` recomputes
    its forward in the backward (benchmarks). ``sync_transfers`` (``MFC_PIPELINE_SYNC_TRANSFERS=1``): wait
    for every transfer on the host (the runtime before issue 20; for benchmarks comparing the two).
    ``trace_file`` (``MFC_PIPELINE_TRACE=<prefix>``): record every run and append it to
    ``<prefix>.rank<r>.jsonl`` (bench/trainer.py's per-step breakdown reads it). ``timeout``
    (``MFC_PIPELINE_TIMEOUT``, seconds, default 900): how long a send/recv may block before the
    watchdog reports the stalled peer and ends the process. ``jit_capture``
    (``MFC_PIPELINE_JIT_CAPTURE=bytecode``, experimental): compile recorded jit stages with
    ``capture_mode="bytecode"``, which MindSpore 2.10 differentiates through a custom backward.
    ``fuse_last`` (``MFC_PIPELINE_FUSE_LAST=0`` turns it off): under jit, a last stage whose backward of a
    microbatch directly follows its forward runs both as one compiled call (``PipelineRuntime``)."""
    recompute: bool = False
    sync_transfers: bool = False
    trace_file: Optional[str] = None
    timeout: float = 900.0
    jit_capture: str = ""
    fuse_last: bool = True

    @classmethod
    def from_env(cls, environ: Optional[Mapping[str, str]] = None) -> "RuntimeOptions":
        env = os.environ if environ is None else environ
        return cls(recompute=env.get("MFC_PIPELINE_RECOMPUTE", "0") == "1",
                   sync_transfers=env.get("MFC_PIPELINE_SYNC_TRANSFERS", "0") == "1",
                   trace_file=env.get("MFC_PIPELINE_TRACE") or None,
                   timeout=float(env.get("MFC_PIPELINE_TIMEOUT", "900")),
                   jit_capture="bytecode" if env.get("MFC_PIPELINE_JIT_CAPTURE", "") == "bytecode" else "",
                   fuse_last=env.get("MFC_PIPELINE_FUSE_LAST", "1") != "0")

    @property
    def bytecode_capture(self) -> bool:
        return self.jit_capture == "bytecode"
