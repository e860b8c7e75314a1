"""Command line: validate a pipeline schedule, print its timeline, write an SVG (and a Chrome trace).

    python -m mindformers_core.pipeline.visualize --schedule 1f1b --stages 4 --microbatches 8
    python -m mindformers_core.pipeline.visualize --schedule interleaved --stages 4 --microbatches 8 \\
        --virtual 2 --svg interleaved.svg
    python -m mindformers_core.pipeline.visualize --schedule zb_h1 --stages 4 --microbatches 8 \\
        --fwd 1 --bwd-input 1 --bwd-weight 1
    python -m mindformers_core.pipeline.visualize --schedule dualpipev --stages 4 --microbatches 16 --overlap 1
    python -m mindformers_core.pipeline.visualize --schedule my_pkg.sched:MyGPipe --stages 4 --microbatches 8
    python -m mindformers_core.pipeline.visualize --order order.json          # a raw exec order
    python -m mindformers_core.pipeline.visualize --trace trace_rank0.json trace_rank1.json \\
        [--schedule 1f1b --stages 2 --microbatches 4] --svg measured.svg

``--schedule`` is a built-in name (``pipeline.BUILTIN_SCHEDULES``) or ``module:Class`` for your own
schedule class. ``--stages`` is the number of pipeline ranks; ``--virtual`` the stages per rank
(the built-in's default: 2 for interleaved, zbv and dualpipev, else 1). Costs are per step of one
stage; ``--overlap`` credits FWD_BWD units, ``--async-send`` validates and simulates posted
point-to-point (wait steps, see ``meta_step``).
``--order FILE`` reads ``{"exec_order": {"0": ["F0@s0", "SEND_F0@s0", ...], ...}}`` (optional keys
``stage_num``, ``micro_batch_num``, ``placement``); ``--dump-order FILE`` writes that form.
``--trace`` draws a timeline measured by ``PipelineRuntime`` (``record = True``, saved with
``render.save_trace``); with a schedule as well, the schedule is simulated with the measured
mean step costs and the prediction is printed beside the measurement.

Exit status: 0 ok; 2 bad arguments or an invalid schedule (the validator's message names the
rank, the position in that rank's list and the step); 1 an unreadable file.
"""
from __future__ import annotations

import argparse
import importlib
import inspect
import json
import math
import re
import sys
from typing import Dict, Optional, Sequence

from .costs import StepCosts
from .errors import ScheduleError
from .meta_step import MetaStep, MetaStepType
from .schedules import BUILTIN_SCHEDULES
from .simulator import Timeline, simulate
from .stage import stages_of_rank
from .validator import describe_exec_order, validate_schedule
from .render import load_trace, mean_step_costs, render_text, to_chrome_trace

_CODES = {t.value: t for t in MetaStepType if t is not MetaStepType.FWD_BWD}   # a unit is written F..+B..
_STEP = re.compile(r"^([A-Z_]+?)(\d+)@s(\d+)$")


class UsageError(Exception):
    """Bad arguments or an invalid schedule: exit status 2."""


def parse_step(text: str) -> MetaStep:
    """``"F3@s1"`` / ``"SEND_B0@s2"`` / ``"F3@s1+B1@s6"`` (a MetaStep's repr) -> MetaStep."""
    if isinstance(text, str) and "+" in text:
        fwd, _, bwd = text.strip().partition("+")
        try:
            return MetaStep.overlapped(parse_step(fwd), parse_step(bwd))
        except ValueError as exc:
            raise ValueError(f"{text!r} is not an overlapped step: write 'F<m>@s<stage>+B<m>@s<stage>' "
                             f"(or +I...) ({exc})") from None
    match = _STEP.match(text.strip()) if isinstance(text, str) else None
    if not match or match[1] not in _CODES:
        raise ValueError(f"{text!r} is not a step; write it as its repr, e.g. 'F3@s1', 'B0@s0', 'I2@s1', 'W2@s1', "
                         f"'SEND_F0@s0', 'RECV_B1@s2', 'WAIT_B1@s2', 'HANDOFF_F3@s3', 'F3@s1+B1@s6' "
                         f"(codes: {', '.join(_CODES)})")
    return MetaStep(int(match[2]), _CODES[match[1]], int(match[3]))


def order_to_json(exec_order, stage_num=None, micro_batch_num=None, placement=None) -> Dict:
    out: Dict = {"exec_order": {str(r): [repr(s) for s in steps] for r, steps in exec_order.items()}}
    if stage_num is not None:
        out.update(stage_num=stage_num, micro_batch_num=micro_batch_num, placement=list(placement))
    return out


def load_order(path: str):
    """(exec_order, stage_num, micro_batch_num, placement) from an ``--order`` file."""
    with open(path) as f:
        try:
            data = json.load(f)
        except ValueError as exc:
            raise UsageError(f"--order {path}: not JSON ({exc})") from None
    if not isinstance(data, dict) or not isinstance(data.get("exec_order"), dict):
        raise UsageError(f"--order {path}: expected a JSON object with \"exec_order\": "
                         "{\"<rank>\": [\"F0@s0\", ...], ...}")
    order = {}
    for rank, steps in data["exec_order"].items():
        try:
            order[int(rank)] = [parse_step(s) for s in steps]
        except (TypeError, ValueError) as exc:
            raise UsageError(f"--order {path}: rank {rank!r}: {exc}") from None
    if "stage_num" in data:
        return order, data["stage_num"], data["micro_batch_num"], data.get("placement")
    try:
        return (order, *describe_exec_order(order))
    except ScheduleError as exc:
        raise UsageError(_schedule_error(exc, order)) from None


def _schedule_error(exc: ScheduleError, exec_order=None) -> str:
    """The validator's message, plus the neighbourhood of the failing step in its rank's list."""
    lines = [f"invalid schedule: {exc}"]
    if exec_order is not None and exc.rank in exec_order and exc.index is not None:
        steps = exec_order[exc.rank]
        lo, hi = max(0, exc.index - 3), min(len(steps), exc.index + 4)
        shown = [("-> " if i == exc.index else "   ") + f"{i:3d} {steps[i]!r}" for i in range(lo, hi)]
        lines.append(f"rank {exc.rank}'s order around step {exc.index}:")
        lines += ["  " + s for s in shown]
    return "\n".join(lines)


def _import_class(spec: str):
    module, _, name = spec.partition(":")
    if not module or not name:
        raise UsageError(f"--schedule {spec!r}: give a built-in name ({', '.join(BUILTIN_SCHEDULES)}) or "
                         "module.path:ClassName")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise UsageError(f"--schedule {spec!r}: cannot import it ({exc})") from None


def schedule_from_name(name: str, stages: int, microbatches: int, virtual: Optional[int] = None,
                       placement: Optional[str] = None):
    """The CLI's schedule for pipeline rank 0 (every rank builds the same global order): a built-in
    name or ``module:Class``, from counts; a bad choice raises ``UsageError``."""
    from .schedule_base import PipelineScheduleSingle
    if name in BUILTIN_SCHEDULES:
        cls, per_rank, default_placement = BUILTIN_SCHEDULES[name]
        if virtual is not None and virtual != per_rank and not (name == "interleaved" and virtual >= 2):
            need = ">= 2" if name == "interleaved" else f"{per_rank}"
            raise UsageError(f"--virtual {virtual}: schedule {name!r} needs {need} stages per rank")
        per_rank = virtual if virtual is not None else per_rank
        placement = placement or default_placement
    else:
        cls = _import_class(name)
        per_rank = virtual or 1
        placement = placement or "interleaved"
    for flag, value in (("--stages", stages), ("--microbatches", microbatches), ("--virtual", per_rank)):
        if value is None or value < 1:
            raise UsageError(f"{flag} {value}: must be a positive integer")
    if not isinstance(cls, type):
        raise UsageError(f"--schedule {name}: {cls!r} is not a class")
    obj = cls.__new__(cls)          # keep a handle on the order if the constructor's validation fails
    try:
        infos = stages_of_rank(0, stages, per_rank, placement)
        if issubclass(cls, PipelineScheduleSingle):
            if per_rank != 1:
                raise UsageError(f"--virtual {per_rank}: {cls.__name__} is a PipelineScheduleSingle "
                                 "(one stage per rank)")
            obj.__init__(infos[0], microbatches)
        elif "placement" in inspect.signature(cls.__init__).parameters:
            obj.__init__(infos, microbatches, placement=placement)
        else:
            obj.__init__(infos, microbatches)     # e.g. the built-ins that fix their own placement
        return obj
    except ScheduleError as exc:
        exc.exec_order = obj.__dict__.get("exec_order")
        raise
    except (ValueError, TypeError) as exc:
        raise UsageError(f"--schedule {name}: {exc}") from None


def _costs(args) -> Dict[str, float]:
    bwd = args.bwd
    if bwd is None:
        bwd = args.bwd_input + args.bwd_weight if args.bwd_input is not None and args.bwd_weight is not None else 2.0
    kwargs = dict(fwd_time=args.fwd, bwd_time=bwd, bwd_input_time=args.bwd_input,
                  bwd_weight_time=args.bwd_weight, comm_time=args.comm, overlap=args.overlap)
    try:
        StepCosts(*kwargs.values())
    except ValueError as exc:
        raise UsageError(f"costs: {exc}") from None
    return kwargs


def summary_table(tl: Timeline, unit: str = "") -> str:
    """Per rank: compute time, bubble, peak in-flight activations (until input grad / weight grad)."""
    ranks = sorted(tl.steps)
    head = f"{'rank':>4}  {'busy' + (' ' + unit if unit else ''):>10}  {'bubble':>7}  {'peak in-flight':>14}  " \
           f"{'until W':>7}"
    lines = [head]
    for r in ranks:
        busy = sum(t.end - t.start for t in tl.steps[r] if t.step.type.is_compute)
        lines.append(f"{r:>4}  {busy:>10.4g}  {tl.bubble_per_rank[r]:>7.1%}  {tl.peak_in_flight.get(r, 0):>14}  "
                     f"{tl.peak_until_weight_grad.get(r, 0):>7}")
    lines.append(f"makespan {tl.makespan:.6g}{' ' + unit if unit else ''}, bubble {tl.bubble_ratio:.1%} overall")
    return "\n".join(lines)


def _measured_unit(tl: Timeline, unit: Optional[float], columns: int = 120) -> float:
    if unit:
        return unit
    shortest = min((t.end - t.start for ts in tl.steps.values() for t in ts
                    if t.step.type.is_compute and t.end > t.start), default=1.0)
    raw = max(shortest, tl.makespan / columns)
    mag = 10 ** math.floor(math.log10(raw))
    return next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)       # a round number of ms per column


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m mindformers_core.pipeline.visualize",
                                description="Validate a pipeline schedule, print its timeline, draw it as SVG.",
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="built-in schedules: " + ", ".join(BUILTIN_SCHEDULES))
    p.add_argument("--schedule", help="built-in name or module.path:Class (default 1f1b)")
    p.add_argument("--stages", type=int, help="pipeline ranks (pp)")
    p.add_argument("--microbatches", type=int, help="microbatches per step")
    p.add_argument("--virtual", type=int, help="stages per rank (default: the schedule's)")
    p.add_argument("--placement", choices=["interleaved", "v"], help="stage placement for a custom Multi schedule")
    p.add_argument("--order", metavar="FILE", help="validate and draw a raw exec order (JSON) instead")
    p.add_argument("--fwd", type=float, default=1.0, help="forward step cost (default 1)")
    p.add_argument("--bwd", type=float, help="full backward cost (default 2, or bwd-input + bwd-weight)")
    p.add_argument("--bwd-input", type=float, help="split backward: input-gradient cost (default bwd / 2)")
    p.add_argument("--bwd-weight", type=float, help="split backward: weight-gradient cost (default bwd - bwd-input)")
    p.add_argument("--comm", type=float, default=0.0, help="send/recv cost (default 0)")
    p.add_argument("--async-send", action="store_true",
                   help="posted point-to-point: sends do not wait for their receive, wait steps complete receives")
    p.add_argument("--overlap", type=float, default=0.0,
                   help="FWD_BWD units: fraction of the shorter half hidden behind the other (0..1, default 0)")
    p.add_argument("--unit", type=float, help="time per text column (default: shortest compute step)")
    p.add_argument("--svg", metavar="FILE", help="write an SVG picture")
    p.add_argument("--chrome", metavar="FILE", help="write a Chrome/Perfetto trace (JSON)")
    p.add_argument("--dump-order", metavar="FILE", help="write the exec order as JSON (the --order format)")
    p.add_argument("--trace", metavar="FILE", nargs="+", help="draw a measured runtime trace (render.save_trace)")
    p.add_argument("--iteration", type=int, default=-1, help="which recorded training step of the trace (default last)")
    p.add_argument("--title", help="SVG title")
    return p


def run(argv: Optional[Sequence[str]] = None, out=None) -> int:
    """The command; returns the exit status (see the module docstring)."""
    out = out or sys.stdout
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        return _run(args, out)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


def _run(args, out) -> int:
    from .svg import save_svg
    sched = order = None
    shape = None
    if args.order and args.schedule:
        raise UsageError("give --schedule or --order, not both")
    if args.order:
        order, *shape = load_order(args.order)
        try:
            validate_schedule(order, *shape, blocking_send=not args.async_send)
        except ScheduleError as exc:
            raise UsageError(_schedule_error(exc, order)) from None
    elif args.schedule or not args.trace:
        name = args.schedule or "1f1b"
        if args.stages is None or args.microbatches is None:
            raise UsageError("--stages and --microbatches are required to build a schedule")
        try:
            sched = schedule_from_name(name, args.stages, args.microbatches, args.virtual, args.placement)
        except ScheduleError as exc:
            raise UsageError(_schedule_error(exc, getattr(exc, "exec_order", None))) from None
        order = sched.exec_order
        shape = [sched.stage_num, sched.micro_batch_num, sched.placement]
    if args.dump_order and order is not None:
        with open(args.dump_order, "w") as f:
            json.dump(order_to_json(order, *shape), f, indent=1)

    costs = _costs(args)
    unit_name = ""
    predicted = None
    if args.trace:
        try:
            tl, meta = load_trace(*args.trace, iteration=args.iteration, with_meta=True)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        unit_name = "ms"
        what = (f"measured timeline{' of ' + meta['name'] if meta.get('name') else ''}: {len(tl.steps)} rank(s), "
                f"times in ms, iteration {args.iteration}")
        if order is not None:
            mean = mean_step_costs(tl)
            fwd = mean.get("FWD", 1.0)
            bwd = mean.get("BWD") or (mean.get("BWD_INPUT", fwd) + mean.get("BWD_WEIGHT", fwd))
            split = {"bwd_input_time": mean["BWD_INPUT"], "bwd_weight_time": mean["BWD_WEIGHT"]} \
                if "BWD_INPUT" in mean and "BWD_WEIGHT" in mean else {}
            predicted = simulate(order, fwd_time=fwd, bwd_time=bwd, comm_time=mean["comm"],
                                 blocking_send=not args.async_send, **split)
        unit = _measured_unit(tl, args.unit)
    else:
        # the schedule itself when built here: it carries its routes (DualPipe's two directions)
        tl = simulate(sched if sched is not None else order, blocking_send=not args.async_send, **costs)
        label = type(sched).__name__ if sched is not None else f"order from {args.order}"
        given = [("F", "fwd_time"), ("B", "bwd_time"), ("I", "bwd_input_time"), ("W", "bwd_weight_time"),
                 ("comm", "comm_time"), ("overlap", "overlap")]
        what = (f"{label}: {shape[0]} stage(s) on {len(order)} rank(s), {shape[1]} microbatch(es); costs "
                + " ".join(f"{k}={costs[v]:g}" for k, v in given if costs[v]))
        unit = args.unit
    print(what, file=out)
    try:
        print(render_text(tl, unit), file=out)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    print(summary_table(tl, unit_name), file=out)
    if predicted is not None:
        print(f"simulated with the measured mean step costs: makespan {predicted.makespan:.4g} ms "
              f"(measured {tl.makespan:.4g}), bubble {predicted.bubble_ratio:.1%} (measured {tl.bubble_ratio:.1%})",
              file=out)
    if args.svg:
        save_svg(args.svg, tl, title=args.title or what, time_unit=unit_name)
        print(f"wrote {args.svg}", file=out)
    if args.chrome:
        with open(args.chrome, "w") as f:
            json.dump(to_chrome_trace(tl), f)
        print(f"wrote {args.chrome}", file=out)
    return 0


def main() -> None:
    sys.exit(run())


if __name__ == "__main__":
    main()
