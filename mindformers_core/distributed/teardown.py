"""``destroy_distributed``: the end of a process's distributed runtime, above everything it clears.

It empties the caches that hold groups and collective Cells (``process_group``, ``comm.functional``),
then releases communication (``env``). It lives apart from ``env`` because those modules import
``env``: with it there, ``env`` would import them back (an import circle).
"""
from __future__ import annotations

from . import env, process_group
from .comm import functional


def destroy_distributed() -> None:
    """Release communication and forget cached groups and collective Cells; safe to call when not
    initialized."""
    if not env.is_initialized():
        return
    process_group.clear_group_cache()
    functional.clear_cache()
    env.release_distributed()
