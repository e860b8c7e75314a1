"""What the loop reports per step: the console line (rank 0) and the JSONL loss log.

``loss.jsonl`` holds one JSON object per step: step, loss, lr, grad_norm, tokens_per_s, step_time_s,
``skipped: true`` for a step the bad-step guard skipped, ``no_target: true`` for a step whose global batch
held no target token (loss 0, no update: not a fault); a mixture-of-experts model adds ``expert_load``,
``expert_load_min``/``max`` and ``aux_loss`` (``moe_log.py``), a model with multi-token prediction
``mtp_loss`` (``mtp_log.py``). NaN and inf are not JSON: they are written as null. A fresh run starts the file anew; a resumed one keeps the steps up to its start.
"""
from __future__ import annotations

import json
import math
import os
from typing import Any, Callable, Dict, Optional


def json_number(value: Optional[float]) -> Optional[float]:
    return value if value is not None and math.isfinite(value) else None


class StepLog:
    def __init__(self, path: str, rank: int, start: int, total_steps: int, tokens_per_step: int, print_every: int,
                 log: Callable[[str], None], extra: Optional[Callable[[], Any]] = None):
        self.path, self.rank, self.total_steps = os.path.abspath(path), rank, total_steps
        self.tokens_per_step, self.print_every, self.log = tokens_per_step, print_every, log
        self.start, self.timed, self.timed_steps = start, 0.0, 0   # steps after this session's first (warm-up)
        self.extra = extra      # () -> (fields for the record, text for the line): the MoE report (moe_log.py)
        if rank == 0:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            kept = []
            if start > 0 and os.path.exists(self.path):
                with open(self.path) as f:
                    kept = [line for line in f if line.strip() and json.loads(line).get("step", 0) <= start]
            with open(self.path + ".tmp", "w") as f:
                f.writelines(kept)
            os.replace(self.path + ".tmp", self.path)

    def step(self, step: int, loss: float, norm: Optional[float], lr: float, t0: float, t1: float, t2: float,
             skipped: Optional[str] = None, empty: bool = False) -> Dict[str, Any]:
        """The record of 1-based ``step`` (data wait t0..t1, compute t1..t2); prints its line.
        ``skipped``: why the update was skipped (None: it was applied); ``empty``: the global batch held no
        target token, so no step ran."""
        if step - 1 > self.start:
            self.timed, self.timed_steps = self.timed + (t2 - t0), self.timed_steps + 1
        eta = (self.timed / self.timed_steps if self.timed_steps else t2 - t0) * (self.total_steps - step)
        record = {"step": step, "loss": json_number(loss), "lr": lr, "grad_norm": json_number(norm),
                  "tokens_per_s": self.tokens_per_step / (t2 - t1), "step_time_s": t2 - t0}
        if skipped:
            record["skipped"] = True
        if empty:
            record["no_target"] = True
        more = ""
        if self.extra is not None:
            fields, more = self.extra()
            record.update(fields)
            more = f"  {more}"
        if empty:
            self.log(f"step {step:>4}/{self.total_steps}  loss {loss:.4f}  lr {lr:.3e}  no target token in the "
                     "global batch: no update (not a fault)" + more)
        elif step % self.print_every == 0 or step == self.total_steps or skipped or not math.isfinite(loss):
            self.log(f"step {step:>4}/{self.total_steps}  loss {loss:.4f}  lr {lr:.3e}  grad_norm {'-' if norm is None else f'{norm:.3f}'}  "
                     f"{self.tokens_per_step / (t2 - t1):,.0f} tok/s  ETA {eta:.0f}s" + more
                     + (f"  skipped ({skipped})" if skipped else ""))
        return record

    def write(self, record: Dict[str, Any]) -> None:
        if self.rank == 0:
            with open(self.path, "a") as f:
                f.write(json.dumps(record, allow_nan=False) + "\n")
