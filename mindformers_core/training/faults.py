"""Fault injection for tests and drills: ``MFC_FAULT`` makes a rank fail at a step on purpose.

``MFC_FAULT="exit:1:3"`` ends rank 1 with exit code 43 when step 3 begins; ``"hang:0:2"`` stops
rank 0 before step 2 (it sleeps: a stalled rank); ``"nan:*:2"`` makes every rank's step-2
gradients NaN (before reduction, clipping and the update). Several faults are separated by
commas; ``*`` means every rank. ``MFC_FAULT_ONCE=<file>``: a fault fires only while that file does
not exist, and firing creates it, so a restarted job does not fail again at the same step.
Unset (the default), nothing is added to any step.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import List, Optional

KINDS = ("exit", "hang", "nan")
EXIT_CODE = 43


@dataclass(frozen=True)
class Fault:
    kind: str
    rank: Optional[int]      # None = every rank
    step: int                # 1-based training step

    def hits(self, rank: int, step: int) -> bool:
        return self.step == step and self.rank in (None, rank)


def parse_faults(text: Optional[str]) -> List[Fault]:
    """``"kind:rank:step,..."`` -> faults; ValueError naming ``MFC_FAULT`` and the bad entry."""
    faults = []
    for item in (text or "").split(","):
        item = item.strip()
        if not item:
            continue
        parts = item.split(":")
        ok = len(parts) == 3 and parts[0] in KINDS and (parts[1] == "*" or parts[1].isdigit()) and parts[2].isdigit()
        if not ok or int(parts[2]) < 1:
            raise ValueError(f"MFC_FAULT={text!r}: entry {item!r} must be kind:rank:step with kind in {list(KINDS)}, "
                             "rank a number or '*', step >= 1 (e.g. 'exit:1:3')")
        faults.append(Fault(parts[0], None if parts[1] == "*" else int(parts[1]), int(parts[2])))
    return faults


class FaultInjector:
    """The faults of this process (from ``MFC_FAULT``); ``before_step`` runs the exit/hang ones,
    ``nan_at(step)`` says whether the step's gradients are to be poisoned."""

    def __init__(self, rank: int, environ=os.environ):
        self.rank = rank
        self.faults = parse_faults(environ.get("MFC_FAULT"))
        self.once = environ.get("MFC_FAULT_ONCE")

    def __bool__(self) -> bool:
        return bool(self.faults)

    def _fire(self, kind: str, step: int) -> bool:
        if not any(f.kind == kind and f.hits(self.rank, step) for f in self.faults):
            return False
        if self.once:
            marker = f"{self.once}.{kind}.{step}.{self.rank}"
            if os.path.exists(marker):
                return False
            with open(marker, "w") as f:
                f.write(f"{kind} at step {step} on rank {self.rank}\n")
        return True

    def before_step(self, step: int) -> None:
        if self._fire("exit", step):
            print(f"MFC_FAULT: rank {self.rank} exits at step {step} (injected)", flush=True)
            os._exit(EXIT_CODE)
        if self._fire("hang", step):
            print(f"MFC_FAULT: rank {self.rank} hangs at step {step} (injected)", flush=True)
            while True:
                time.sleep(3600)

    def nan_at(self, step: int) -> bool:
        return self._fire("nan", step)
