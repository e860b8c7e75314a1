"""One error type for every way a checkpoint can be wrong, raised before any data is returned.

A load either gives every requested tensor or raises :class:`CheckpointError` listing all the
problems found (file, tensor, expected, found), so a user fixes them in one pass and a training
job never starts from a half-loaded model.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence

MAX_SHOWN = 20


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a checkpoint: ``what`` happened to ``tensor`` in ``file``."""
    what: str
    file: Optional[str] = None
    tensor: Optional[str] = None
    expected: Optional[str] = None
    found: Optional[str] = None

    def __str__(self) -> str:
        where = ", ".join(p for p in (self.file, f"tensor {self.tensor!r}" if self.tensor else None) if p)
        text = f"{where}: {self.what}" if where else self.what
        if self.expected is not None:
            text += f"; expected {self.expected}"
        if self.found is not None:
            text += f"; found {self.found}"
        return text


class CheckpointError(RuntimeError):
    """A checkpoint cannot be saved or loaded as asked. ``problems`` lists every issue; ``file``,
    ``tensor``, ``expected`` and ``found`` are those of the first one."""

    def __init__(self, where: str, problems: Sequence[Problem]) -> None:
        self.where = where
        self.problems: List[Problem] = list(problems)
        first = self.problems[0] if self.problems else Problem("unknown problem")
        self.file, self.tensor, self.expected, self.found = first.file, first.tensor, first.expected, first.found
        n = len(self.problems)
        lines = [f"{where}: {n} problem{'s' if n != 1 else ''}, nothing was loaded or published:"]
        lines += [f"  - {p}" for p in self.problems[:MAX_SHOWN]]
        if n > MAX_SHOWN:
            lines.append(f"  ... and {n - MAX_SHOWN} more")
        super().__init__("\n".join(lines))


def raise_if(where: str, problems: Sequence[Problem]) -> None:
    if problems:
        raise CheckpointError(where, problems)
