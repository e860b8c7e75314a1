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

Not for graphs with data-dependent shapes: ``compile_blocking(fn, cells=...)`` falls back to ``ms.jit`` when a
Cell in ``cells`` (or below it) has a true ``dynamic_shapes_under_jit`` attribute, as the expert-parallel
experts on their variable-count path have (sharding/expert_parallel.py: ``ops.nonzero`` row sets). Launched
this way, gradient graphs holding that path gave wrong weight gradients, sometimes garbage (150x off), or failed
to launch (``Grad_Gather/UnsortedSegmentSum``), depending on which other graphs had run in the process before
or between their launches (msrun, 2 and 4 ranks; MindSpore's own launch and PyNative agreed every time; the
padded path, static shapes, was right every time; docs/config.md has the cases). The pipeline runtime's
per-microbatch graphs keep ``ms.jit`` in any case (pipeline/runtime.py): they gained nothing from it.

``MFC_JIT_BLOCKING=0`` (environment, read when a function is compiled) gives plain ``ms.jit`` (to
measure the difference; the numbers are the same either way).

:func:`eager_ops_in_calling_thread` is the CPU default for PyNative outside the trainer (which has its own
setting, ``training/cli.py`` ``pynative_sync_setting``): MindSpore's dispatch queue spins while it waits, and on
two cores that took the kernels' time (Qwen3-0.6B's forward of 64 tokens: 3.7-4.8 s queued, 0.80-0.90 s in
the calling thread).
"""
from __future__ import annotations

import os
from typing import Callable, Iterable

BLOCKING_ENV = "MFC_JIT_BLOCKING"
PYNATIVE_SYNC_ENV = "MFC_PYNATIVE_SYNC"


def eager_ops_in_calling_thread() -> bool:
    """On CPU, unless ``MFC_PYNATIVE_SYNC=0``: ``mindspore.set_context(pynative_synchronize=True)`` (module
    docstring); returns whether eager ops now run in the calling thread. Called by the library's entry points
    that run a model eagerly (``from_pretrained``); a no-op elsewhere."""
    import mindspore as ms
    text = os.environ.get(PYNATIVE_SYNC_ENV, "").strip()
    if text not in ("", "0", "1"):
        raise ValueError(f"{PYNATIVE_SYNC_ENV}={text!r} (environment): must be 0 (MindSpore's dispatch queue) or 1 "
                         "(eager ops run in the calling thread; the default on CPU)")
    device = os.environ.get("MFC_DEVICE_TARGET") or ms.get_context("device_target")
    if text == "0" or (text == "" and str(device).upper() != "CPU"):
        return bool(ms.get_context("pynative_synchronize"))
    ms.set_context(pynative_synchronize=True)
    return True


def blocking_launch_enabled(environ=None) -> bool:
    """``MFC_JIT_BLOCKING`` unset, empty or ``1``: on; ``0``: off; anything else raises ValueError."""
    text = (os.environ if environ is None else environ).get(BLOCKING_ENV, "").strip()
    if text not in ("", "0", "1"):
        raise ValueError(f"{BLOCKING_ENV}={text!r} (environment): must be 0 (MindSpore's asynchronous graph "
                         "launch) or 1 (the launch runs in the calling thread; the default)")
    return text != "0"


DYNAMIC_SHAPES_ATTR = "dynamic_shapes_under_jit"


def holds_dynamic_shapes(cells: Iterable) -> bool:
    """True when a Cell in ``cells``, or one below it, says (attribute ``dynamic_shapes_under_jit``) that its
    compiled graph computes on data-dependent shapes."""
    return any(getattr(c, DYNAMIC_SHAPES_ATTR, False) for cell in cells for _, c in cell.cells_and_names())


def compile_blocking(fn: Callable, cells: Iterable = (), **jit_kwargs) -> Callable:
    """``ms.jit(fn, **jit_kwargs)`` launched in the calling thread (module docstring); same arguments,
    same outputs. ``cells``: the Cells ``fn`` runs; when one holds data-dependent shapes
    (:func:`holds_dynamic_shapes`) this is plain ``ms.jit(fn)``, MindSpore's own launch."""
    import mindspore as ms
    if not blocking_launch_enabled() or holds_dynamic_shapes(cells):
        return ms.jit(fn, **jit_kwargs)

    def with_none(*args):
        return fn(*args), None

    graph = ms.jit(with_none, **jit_kwargs)

    def call(*args):
        return graph(*args)[0]
    call.__wrapped__ = fn
    call.blocking = True        # tests, bench: which launch this callable uses
    return call
