"""Draw a timeline: an ASCII chart for terminals and logs, a Chrome trace for chrome://tracing or
Perfetto (and an SVG picture, :mod:`.svg`). All take a simulated ``Timeline``, a schedule, or a bare
exec order (simulated with the default costs).

Measured timelines: ``PipelineRuntime`` with ``record = True`` appends ``(MetaStep, start, end)``
(``time.perf_counter`` seconds) to ``runtime.trace`` for every step it runs. ``save_trace`` writes
that list as JSON (one file per rank, or several ranks in one file); ``load_trace`` merges the
files back into a ``Timeline`` (in milliseconds, the earliest step of all ranks at 0) that every
drawing function accepts. Trace file format (version 1)::

    {"format": "mindformers_core.pipeline.trace", "version": 1, "time_unit": "s",
     "schedule": {"name": "Schedule1F1B", "stage_num": 4, "micro_batch_num": 8,
                  "placement": [0, 1, 2, 3]},                        # optional
     "ranks": {"0": [["FWD", 0, 0, 12.5031, 12.5102], ...]}}        # type name, micro, stage, start, end

A ``FWD_BWD`` unit's row has a sixth entry, its backward half: ``["FWD_BWD", 3, 0, t0, t1, ["BWD", 1, 3]]``.
"""
from __future__ import annotations

import json
import os
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from .meta_step import MetaStep, MetaStepType
from .replay import StepTiming
from .simulator import Timeline, in_flight_peaks, simulate

TRACE_FORMAT = "mindformers_core.pipeline.trace"
RawTrace = Sequence[Tuple[MetaStep, float, float]]


def as_timeline(source) -> Timeline:
    """A ``Timeline`` as given, or the simulation (default costs) of a schedule or exec order."""
    return source if isinstance(source, Timeline) else simulate(source)


def _label(step, several_stages: bool) -> str:
    return repr(step) if several_stages else f"{step.type.value}{step.micro_index}"


def render_text(source, unit: Optional[float] = None) -> str:
    """One row per rank, one column per ``unit`` of time (default: the shortest compute step).
    A compute step shows as its label (``F3``, ``B3``, ``I3``, ``W3``; with ``@s<stage>`` when a
    rank holds several stages) followed by dashes while it lasts; ``.`` marks a column where the
    rank computes nothing (idle, or waiting in a send/receive)."""
    tl = as_timeline(source)
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
    tl = as_timeline(source)
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


# ---- measured timelines ------------------------------------------------------------------------

def _trace_rows(trace: RawTrace, where: str) -> List[list]:
    rows = []
    for i, item in enumerate(trace):
        try:
            step, start, end = item
        except (TypeError, ValueError):
            raise TypeError(f"{where}: entry {i} is {item!r}; expected (MetaStep, start, end)") from None
        if not isinstance(step, MetaStep):
            raise TypeError(f"{where}: entry {i} starts with {step!r}, not a MetaStep")
        row = [step.type.name, step.micro_index, step.stage_index, float(start), float(end)]
        if step.backward is not None:                     # a FWD_BWD unit: its backward half too
            row.append([step.backward.type.name, step.backward.micro_index, step.backward.stage_index])
        rows.append(row)
    return rows


def trace_to_dict(source, rank: Optional[int] = None) -> Dict[str, Any]:
    """The JSON-serialisable trace (format in the module docstring). ``source``: a
    ``PipelineRuntime`` (its ``trace``, its schedule's pipeline rank and shape), a list of
    ``(MetaStep, start, end)`` with ``rank``, or a dict ``{rank: such a list}``."""
    schedule = getattr(source, "schedule", None)
    if hasattr(source, "trace"):
        rank = schedule.rank if rank is None else rank
        by_rank = {rank: source.trace}
    elif isinstance(source, Mapping):
        by_rank = dict(source)
    else:
        if rank is None:
            raise ValueError("trace_to_dict: a bare list of (MetaStep, start, end) needs rank=<pipeline rank>")
        by_rank = {rank: source}
    out: Dict[str, Any] = {"format": TRACE_FORMAT, "version": 1, "time_unit": "s"}
    if schedule is not None:
        out["schedule"] = {"name": type(schedule).__name__, "stage_num": schedule.stage_num,
                           "micro_batch_num": schedule.micro_batch_num, "placement": list(schedule.placement)}
    out["ranks"] = {str(r): _trace_rows(t, f"trace of rank {r}") for r, t in sorted(by_rank.items())}
    return out


def save_trace(path: str, source, rank: Optional[int] = None) -> str:
    """Write ``trace_to_dict(source, rank)`` to ``path`` atomically; returns ``path``. Call it on
    every pipeline rank (e.g. ``trace_rank{r}.json``) and pass all files to ``load_trace``."""
    data = trace_to_dict(source, rank)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(data, f)
    os.replace(tmp, path)
    return path


def _read_trace_file(path: str) -> Dict[str, Any]:
    try:
        with open(path) as f:
            data = json.load(f)
    except json.JSONDecodeError as exc:
        raise ValueError(f"load_trace: {path} is not JSON ({exc})") from None
    if not isinstance(data, dict) or data.get("format") != TRACE_FORMAT or not isinstance(data.get("ranks"), dict):
        raise ValueError(f"load_trace: {path} is not a pipeline trace (expected a JSON object with "
                         f'"format": "{TRACE_FORMAT}" and "ranks"; write it with save_trace)')
    if data.get("version") != 1:
        raise ValueError(f"load_trace: {path} has trace version {data.get('version')!r}; this code reads version 1")
    return data


def parse_trace_rows(rows, where: str) -> List[Tuple[MetaStep, float, float]]:
    """A rank's rows of a trace file (``[type name, micro, stage, start, end]``) as
    ``(MetaStep, start, end)``; ``where`` names the rows in error messages."""
    out = []
    for i, row in enumerate(rows):
        try:
            name, micro, stage, start, end, *back = row
            backward = MetaStep(int(back[0][1]), MetaStepType[back[0][0]], int(back[0][2])) if back else None
            step = MetaStep(int(micro), MetaStepType[name], int(stage), backward)
        except (KeyError, TypeError, ValueError, IndexError):
            raise ValueError(f"load_trace: {where} entry {i} = {row!r}; expected [type name "
                             f"({', '.join(t.name for t in MetaStepType)}), micro, stage, start, end]") from None
        if not end >= start:
            raise ValueError(f"load_trace: {where} entry {i} = {row!r} ends before it starts")
        out.append((step, float(start), float(end)))
    return out


def split_iterations(trace: RawTrace) -> List[List[Tuple[MetaStep, float, float]]]:
    """A rank's trace cut into training steps: a step that repeats starts the next iteration
    (``runtime.trace`` keeps growing over every recorded run)."""
    runs: List[List[Tuple[MetaStep, float, float]]] = []
    seen: set = set()
    for item in trace:
        if not runs or item[0] in seen:
            runs.append([])
            seen = set()
        runs[-1].append(tuple(item))
        seen.add(item[0])
    return runs


def timeline_from_trace(trace_by_rank: Mapping[int, RawTrace], iteration: int = -1,
                        scale: float = 1e3) -> Timeline:
    """A ``Timeline`` from measured ``{rank: [(MetaStep, start, end), ...]}`` (seconds): one
    iteration (default the last recorded), times multiplied by ``scale`` (default: milliseconds)
    and shifted so the earliest step of any rank starts at 0 (ranks on one host share the
    ``perf_counter`` clock). Bubble and in-flight peaks are computed as the simulator does."""
    if not trace_by_rank:
        raise ValueError("timeline_from_trace: no ranks in the trace")
    chosen: Dict[int, List[Tuple[MetaStep, float, float]]] = {}
    for rank, trace in sorted(trace_by_rank.items()):
        runs = split_iterations(trace)
        if not runs:
            raise ValueError(f"timeline_from_trace: rank {rank} recorded no steps (set runtime.record = True "
                             "before running)")
        if not -len(runs) <= iteration < len(runs):
            raise ValueError(f"timeline_from_trace: iteration={iteration} but rank {rank} recorded "
                             f"{len(runs)} iteration(s); use 0..{len(runs) - 1} or -1 for the last")
        chosen[rank] = runs[iteration]
    t0 = min(start for run in chosen.values() for _, start, _ in run)
    steps = {r: [StepTiming(step, (a - t0) * scale, (b - t0) * scale) for step, a, b in run]
             for r, run in chosen.items()}
    makespan = max(t.end for ts in steps.values() for t in ts)
    busy = {r: sum(t.end - t.start for t in ts if t.step.type.is_compute) for r, ts in steps.items()}
    bubble = {r: (1 - b / makespan) if makespan else 0.0 for r, b in busy.items()}
    total = (1 - sum(busy.values()) / (makespan * len(steps))) if makespan else 0.0
    per_rank, per_stage, until_w = in_flight_peaks(steps)
    return Timeline(steps, makespan, total, bubble, per_rank, per_stage, until_w)


def load_trace(*paths: str, iteration: int = -1, scale: float = 1e3,
               with_meta: bool = False) -> Union[Timeline, Tuple[Timeline, Dict[str, Any]]]:
    """Merge trace files (one per rank, or several ranks per file) into a measured ``Timeline``
    in milliseconds (see ``timeline_from_trace``). ``with_meta=True`` also returns the files'
    ``schedule`` entry (empty dict when none was saved)."""
    if not paths:
        raise ValueError("load_trace: give at least one trace file")
    merged: Dict[int, List[Tuple[MetaStep, float, float]]] = {}
    meta: Dict[str, Any] = {}
    for path in paths:
        data = _read_trace_file(path)
        meta = meta or dict(data.get("schedule") or {})
        factor = {"s": 1.0, "ms": 1e-3, "us": 1e-6}.get(data.get("time_unit", "s"))
        if factor is None:
            raise ValueError(f"load_trace: {path} has time_unit={data.get('time_unit')!r}; valid: 's', 'ms', 'us'")
        for key, rows in data["ranks"].items():
            try:
                rank = int(key)
            except ValueError:
                raise ValueError(f"load_trace: {path} has rank key {key!r}; ranks are integers") from None
            if rank in merged:
                raise ValueError(f"load_trace: rank {rank} appears in two trace files (second: {path})")
            merged[rank] = [(s, a * factor, b * factor) for s, a, b in parse_trace_rows(rows, f"{path} rank {rank}")]
    tl = timeline_from_trace(merged, iteration, scale)
    return (tl, meta) if with_meta else tl


def mean_step_costs(timeline: Timeline) -> Dict[str, float]:
    """Mean duration per compute step type (``FWD``, ``BWD``, ``BWD_INPUT``, ``BWD_WEIGHT``) and the
    shortest send/recv (``comm``, the transfer itself without waiting) of a timeline: the costs to
    simulate the same schedule with and compare the prediction against the measurement."""
    sums: Dict[str, List[float]] = {}
    comm = []
    for ts in timeline.steps.values():
        for t in ts:
            if t.step.type.is_compute:
                sums.setdefault(t.step.type.name, []).append(t.end - t.start)
            elif t.step.type.is_p2p:
                comm.append(t.end - t.start)
    out = {k: sum(v) / len(v) for k, v in sums.items()}
    out["comm"] = min(comm, default=0.0)
    return out
