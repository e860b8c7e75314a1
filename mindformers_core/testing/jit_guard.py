"""Catch ``ms.jit`` functions recompiled at every call.

MindSpore treats a plain tuple or list of Tensors passed to a ``jit`` function as a constant: a
call with new Tensors compiles the graph again (a second each time on a small model) and only
logs a warning. The fix is ``ms.mutable(tuple_of_tensors)``. The guard turns that warning into a
failure for the test suite and the msrun workers."""
import logging
from typing import List

MESSAGE = "Constant value tensor are detected in tuple or list"


class ConstantTupleGuard(logging.Handler):
    """Records MindSpore's constant-tuple recompilation warnings (``seen``)."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.seen: List[str] = []

    def emit(self, record):
        text = record.getMessage()
        if MESSAGE in text:
            self.seen.append(text[:400])

    def report(self) -> str:
        return (f"{len(self.seen)} ms.jit call(s) recompiled because a tuple of Tensors was passed as a "
                f"constant; wrap it in ms.mutable(...). First:\n{self.seen[0]}")


def install_guard() -> ConstantTupleGuard:
    """Attach a guard to MindSpore's logger (one per process is enough)."""
    from mindspore import log
    guard = ConstantTupleGuard()
    log._get_logger().addHandler(guard)
    return guard
