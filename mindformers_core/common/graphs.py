"""``compile_blocking(fn)``: ``ms.jit(fn)`` whose launch runs in the calling thread.

Why (MindSpore 2.10 on CPU, measured on the 2-core machines; docs/pipeline.md "Measured"): a jit
function whose outputs are all Tensors returns at once with placeholder Tensors and runs in
MindSpore's launch pipeline; the first read of an output (``asnumpy``, ``float``) then waits in
``AsyncRQueue::Wait``, which spins (no sleep, no yield). With the kernels needing the same cores, the
bench Llama's jit step (``value_and_grad`` + AdamW, one process) took 0.50-0.55 s with 0.83 s user
and 0.19 s system CPU per step, perf putting 30% of all samples in that wait. The same graph with one
``None`` among its outputs is launched synchronously (placeholders cannot stand for ``None``): 0.23-0.31 s,
0.45 s user and 0.05 s system, the same kernels, bitwise the same parameters after the step.
``ms.set_context(pynative_synchronize=True)``, ``MS_DEV_RUNTIME_CONF="pipeline:false"`` and
``ms.runtime.launch_blocking()`` did not change it. So the compiled function returns ``(outputs, None)``
and the wrapper hands back ``outputs``.

Not used for the pipeline runtime's per-microbatch graphs (pipeline/runtime.py keeps ``ms.jit``): with the
recomputing backward graphs launched this way, msrun pp2 x dp2 x ep2 1F1B under jit with the variable-count
expert exchange (tests/test_moe_pp_msrun.py) got wrong expert gradients at every launch after the first (the
next microbatch, or the next step), from graph inputs bitwise equal to those of MindSpore's launch (up to 84% relative on one rank's w_gate; the
embedding weight 1.72e-3 off after 2 steps, every run). Right with only the forward graphs launched this
way, and with the padded exchange; host syncs before every launch did not help; a whole MoE model's
backward graph of the same kind on 2 or 4 ranks (ep2) was right. The trainer's own graphs
(one step graph, or gradient graphs per accumulation micro-step) with ep2 under jit equal PyNative.
Cause not found (docs/config.md, ``MFC_JIT_BLOCKING``).

``MFC_JIT_BLOCKING=0`` (environment, read when a function is compiled) gives plain ``ms.jit`` (to
measure the difference; the numbers are the same either way).
"""
from __future__ import annotations

import os
from typing import Callable

BLOCKING_ENV = "MFC_JIT_BLOCKING"


def blocking_launch_enabled(environ=None) -> bool:
    """``MFC_JIT_BLOCKING`` unset, empty or ``1``: on; ``0``: off; anything else raises ValueError."""
    text = (os.environ if environ is None else environ).get(BLOCKING_ENV, "").strip()
    if text not in ("", "0", "1"):
        raise ValueError(f"{BLOCKING_ENV}={text!r} (environment): must be 0 (MindSpore's asynchronous graph "
                         "launch) or 1 (the launch runs in the calling thread; the default)")
    return text != "0"


def compile_blocking(fn: Callable, **jit_kwargs) -> Callable:
    """``ms.jit(fn, **jit_kwargs)`` launched in the calling thread (module docstring); same arguments,
    same outputs."""
    import mindspore as ms
    if not blocking_launch_enabled():
        return ms.jit(fn, **jit_kwargs)

    def with_none(*args):
        return fn(*args), None

    graph = ms.jit(with_none, **jit_kwargs)

    def call(*args):
        return graph(*args)[0]
    call.__wrapped__ = fn
    call.blocking = True        # tests, bench: which launch this callable uses
    return call
