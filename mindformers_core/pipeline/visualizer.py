"""Draw a timeline: an ASCII chart for terminals and logs, a Chrome trace for chrome://tracing or
Perfetto. Both take a simulated ``Timeline``, a schedule, or a bare exec order (simulated with the
default costs); a measured timeline from a real run can be drawn the same way once it is turned
into a ``Timeline``.
"""
from __future__ import annotations

from typing import Any, Dict, Optional

from .simulator import Timeline, simulate


def _timeline(source) -> Timeline:
    return source if isinstance(source, Timeline) else simulate(source)


def _label(step, several_stages: bool) -> str:
    return repr(step) if several_stages else f"{step.type.value}{step.micro_index}"


def render_text(source, unit: Optional[float] = None) -> str:
    """One row per rank, one column per ``unit`` of time (default: the shortest compute step).
    A compute step shows as its label (``F3``, ``B3``, ``I3``, ``W3``; with ``@s<stage>`` when a
    rank holds several stages) followed by dashes while it lasts; ``.`` marks a column where the
    rank computes nothing (idle, or waiting in a send/receive)."""
    tl = _timeline(source)
    compute = {r: [t for t in ts if t.step.type.is_compute] for r, ts in tl.steps.items()}
    durations = [t.end - t.start for ts in compute.values() for t in ts]
    unit = unit or min(durations, default=1.0)
    if unit <= 0:
        raise ValueError(f"render_text: unit={unit!r} must be > 0")
    several = {r: len({t.step.stage_index for t in ts}) > 1 for r, ts in compute.items()}
    width = 1 + max((len(_label(t.step, several[r])) for r, ts in compute.items() for t in ts), default=2)
    cols = max(1, round(tl.makespan / unit))
    head = f"rank {max(tl.steps, default=0)} |"
    axis = "".join(f"{c * unit:<{5 * width}g}" for c in range(0, cols, 5))
    lines = [(" " * (len(head) - 1) + "|" + axis).rstrip()]
    for rank, ts in compute.items():
        row = list(("." + " " * (width - 1)) * cols)
        for t in ts:
            first = round(t.start / unit)
            span = max(1, round(t.end / unit) - first)
            label = _label(t.step, several[rank])
            fill = "-" if span > 1 else " "
            row[first * width:(first + span) * width] = label.ljust(span * width - 1, fill) + " "
        lines.append(f"rank {rank}".ljust(len(head) - 1) + "|" + "".join(row).rstrip())
    lines.append(f"makespan {tl.makespan:g}, bubble {tl.bubble_ratio:.1%}, peak in-flight activations "
                 f"per rank {list(tl.peak_in_flight.values())}; F forward, B backward, I input grad, "
                 "W weight grad, . no compute")
    return "\n".join(lines)


def to_chrome_trace(source, time_unit_us: float = 1000.0) -> Dict[str, Any]:
    """The timeline in the Chrome trace-event format (JSON-serialisable): one thread per rank,
    one complete event per step (sends, receives and handoffs included, category ``comm`` /
    ``handoff``). One time unit of the timeline becomes ``time_unit_us`` microseconds."""
    tl = _timeline(source)
    events = [{"name": "process_name", "ph": "M", "pid": 0, "args": {"name": "pipeline"}}]
    for rank, ts in tl.steps.items():
        events.append({"name": "thread_name", "ph": "M", "pid": 0, "tid": rank,
                       "args": {"name": f"rank {rank}"}})
        for t in ts:
            kind = t.step.type
            events.append({
                "name": repr(t.step), "ph": "X", "pid": 0, "tid": rank,
                "cat": "compute" if kind.is_compute else "handoff" if kind.is_handoff else "comm",
                "ts": t.start * time_unit_us, "dur": (t.end - t.start) * time_unit_us,
                "args": {"type": kind.name, "micro_index": t.step.micro_index,
                         "stage_index": t.step.stage_index}})
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"makespan": tl.makespan, "bubble_ratio": tl.bubble_ratio}}
