"""Per-rank heartbeats: each rank says, in a small file, that it is alive and which step it reached.

``<output_dir>/heartbeat/rank_<r>.json`` holds ``{"rank", "pid", "step", "time", "state"}``, written
atomically when the rank starts and after every step. The job's supervisor (``supervisor.py``) reads
them to tell, within a second or two, which rank died (its process is gone) or stalled (no beat
for longer than the deadline, or its process is stopped) — msrun alone takes ~30 s and may blame
the wrong worker.
"""
from __future__ import annotations

import json
import os
import time
from typing import Dict, Optional

DIRNAME = "heartbeat"


def heartbeat_dir(output_dir: str) -> str:
    return os.path.join(output_dir, DIRNAME)


class Heartbeat:
    """The writer one rank holds."""

    def __init__(self, output_dir: str, rank: int):
        self.path = os.path.join(heartbeat_dir(output_dir), f"rank_{rank}.json")
        self.rank = rank
        os.makedirs(os.path.dirname(self.path), exist_ok=True)

    def beat(self, step: int, state: str = "training") -> None:
        tmp = f"{self.path}.tmp-{os.getpid()}"
        with open(tmp, "w") as f:
            json.dump({"rank": self.rank, "pid": os.getpid(), "step": step, "time": time.time(), "state": state}, f)
        os.replace(tmp, self.path)


def read_heartbeats(output_dir: str) -> Dict[int, dict]:
    """rank -> its last heartbeat (ranks that have not written one yet are absent)."""
    found = {}
    directory = heartbeat_dir(output_dir)
    if not os.path.isdir(directory):
        return found
    for name in os.listdir(directory):
        if name.startswith("rank_") and name.endswith(".json"):
            try:
                with open(os.path.join(directory, name)) as f:
                    beat = json.load(f)
                found[int(beat["rank"])] = beat
            except (OSError, ValueError, KeyError, TypeError):
                continue     # being replaced right now: read it at the next poll
    return found


def clear_heartbeats(output_dir: str) -> None:
    directory = heartbeat_dir(output_dir)
    if os.path.isdir(directory):
        for name in os.listdir(directory):
            try:
                os.remove(os.path.join(directory, name))
            except OSError:
                pass


def process_state(pid: int) -> Optional[str]:
    """'running', 'stopped' (SIGSTOP, traced), 'zombie' or None when the process is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            return "running"
        return "running"
    return {"T": "stopped", "t": "stopped", "Z": "zombie", "X": None}.get(state, "running")
