"""The ```python blocks of README.md and docs/*.md, and how each one runs.

A block runs in one process unless one of its leading comment lines is the msrun marker
``# msrun: N workers``; then it runs on N msrun workers (see docs/testing.md, "Docs blocks").
A leading comment line that starts with ``# msrun`` but does not match the marker is an error, so a
misspelt marker cannot silently turn an msrun example into a one-process one.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import List, Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FENCE = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.S | re.M)
MARKER = re.compile(r"^#\s*msrun:\s*(\d+)\s+workers?\s*$")


@dataclass(frozen=True)
class DocBlock:
    path: str          # relative to the repository root
    line: int          # line of the opening fence
    source: str
    nproc: Optional[int]   # None: one process

    @property
    def id(self) -> str:
        return f"{self.path}:{self.line}"


def doc_files() -> List[str]:
    docs = sorted(f for f in os.listdir(os.path.join(ROOT, "docs")) if f.endswith(".md"))
    return ["README.md"] + [f"docs/{f}" for f in docs]


def marker_of(source: str, where: str) -> Optional[int]:
    """The worker count of the block's msrun marker, or None (one process)."""
    for line in source.splitlines():
        stripped = line.strip()
        if not stripped:
            continue
        if not stripped.startswith("#"):
            return None
        if stripped.replace(" ", "").startswith("#msrun"):
            match = MARKER.match(stripped)
            if not match:
                raise ValueError(f"{where}: malformed msrun marker {stripped!r}; write '# msrun: N workers'")
            return int(match.group(1))
    return None


def blocks_of(path: str) -> List[DocBlock]:
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        text = f.read()
    found = []
    for match in FENCE.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        found.append(DocBlock(path, line, match.group(1), marker_of(match.group(1), f"{path}:{line}")))
    return found


def all_blocks() -> List[DocBlock]:
    return [block for path in doc_files() for block in blocks_of(path)]
