"""Draw a pipeline timeline as a standalone SVG picture (hand-written SVG, standard library only).

One row per rank; every compute step is a box coloured by its type (F forward, B backward,
I input gradient, W weight gradient) with its microbatch number inside, placed at its start and as
wide as it lasts. An overlapped FWD_BWD unit is one box, its upper half in the forward's colour and
its lower half in its backward's, labelled ``3|1`` (forward's microbatch | backward's). When a rank holds several stages, the boxes of its later stages are lighter and
their tooltip names the stage. Sends/receives that take time show as a thin grey bar under the row
(waiting for the peer included). Below: a time axis, a legend and the makespan / bubble / in-flight
summary. Hovering a box shows ``F3@s1  12–13`` (SVG ``<title>``).

Every compute box is a ``<rect class="step step-F" data-step="F3@s1" ...>``, so tools and tests can
find them.
"""
from __future__ import annotations

import math
from typing import List, Optional
from xml.sax.saxutils import escape, quoteattr

from .simulator import Timeline
from .render import as_timeline

COLORS = {"F": "#4e79a7", "B": "#f28e2b", "I": "#e15759", "W": "#59a14f", "FB": "#4e79a7"}
NAMES = {"F": "forward", "B": "backward", "I": "input grad", "W": "weight grad",
         "FB": "forward + backward overlapped"}
LEFT, RIGHT, TOP, ROW_H, BOX_H = 72, 24, 34, 30, 22
CHAR_W = 7.0          # approximate width of one 11px digit


def _nice_step(span: float, ticks: int = 10) -> float:
    raw = span / ticks if span > 0 else 1.0
    mag = 10 ** math.floor(math.log10(raw))
    return next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)


def _fmt(x: float) -> str:
    return f"{x:.6g}"


def render_svg(source, title: Optional[str] = None, time_unit: str = "",
               px_per_step: float = 26.0, max_width: float = 1600.0) -> str:
    """The SVG document (a string) for a ``Timeline``, a schedule or a bare exec order.

    ``time_unit`` labels the axis (``"ms"`` for measured timelines); the shortest compute step is
    drawn about ``px_per_step`` pixels wide unless the picture would exceed ``max_width``."""
    tl: Timeline = as_timeline(source)
    ranks = sorted(tl.steps)
    compute = {r: [t for t in tl.steps[r] if t.step.type.is_compute] for r in ranks}
    shortest = min((t.end - t.start for ts in compute.values() for t in ts if t.end > t.start), default=1.0)
    span = tl.makespan or 1.0
    plot_w = min(max_width - LEFT - RIGHT, max(480.0, span / shortest * px_per_step))
    scale = plot_w / span
    width = LEFT + plot_w + RIGHT
    rows_h = ROW_H * len(ranks)
    axis_y = TOP + rows_h
    height = axis_y + 34 + 26 + 18 * 3
    out: List[str] = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
        f'viewBox="0 0 {width:.0f} {height:.0f}" font-family="Helvetica, Arial, sans-serif" font-size="11">',
        "<style>.step{stroke:#ffffff;stroke-width:1}.label{fill:#ffffff;text-anchor:middle;"
        "dominant-baseline:central;pointer-events:none}.comm{fill:#9a9a9a}.axis{stroke:#555555}"
        ".grid{stroke:#dddddd}</style>",
        f'<rect x="0" y="0" width="{width:.0f}" height="{height:.0f}" fill="#ffffff"/>',
    ]
    heading = title or (f"pipeline timeline: {len(ranks)} rank(s), makespan {_fmt(tl.makespan)}"
                        f"{' ' + time_unit if time_unit else ''}")
    out.append(f'<text x="{LEFT}" y="20" font-size="14" font-weight="bold">{escape(heading)}</text>')

    tick = _nice_step(span)
    n_ticks = int(span / tick + 1e-9)
    for k in range(n_ticks + 1):
        x = LEFT + k * tick * scale
        out.append(f'<line class="grid" x1="{x:.1f}" y1="{TOP}" x2="{x:.1f}" y2="{axis_y}"/>')
    for i, rank in enumerate(ranks):
        y = TOP + i * ROW_H
        if i % 2:
            out.append(f'<rect x="{LEFT}" y="{y}" width="{plot_w:.1f}" height="{ROW_H}" fill="#f4f4f4" '
                       'fill-opacity="0.6"/>')
        out.append(f'<text x="{LEFT - 8}" y="{y + ROW_H / 2:.1f}" text-anchor="end" '
                   f'dominant-baseline="central">rank {rank}</text>')
        stages = sorted({t.step.stage_index for t in compute[rank]})
        several = len(stages) > 1
        box_y = y + (ROW_H - BOX_H) / 2
        for t in tl.steps[rank]:
            kind = t.step.type
            x, w = LEFT + t.start * scale, (t.end - t.start) * scale
            if kind.is_p2p and w > 0.5:
                out.append(f'<rect class="comm" x="{x:.2f}" y="{y + ROW_H - 4}" width="{w:.2f}" height="3">'
                           f"<title>{escape(repr(t.step))}  {_fmt(t.start)}–{_fmt(t.end)}</title></rect>")
            if not kind.is_compute:
                continue
            code = kind.value
            chunk = stages.index(t.step.stage_index)
            opacity = 1.0 if chunk == 0 else max(0.45, 1.0 - 0.3 * chunk)
            out.append(f'<rect class="step step-{code}" data-step={quoteattr(repr(t.step))} x="{x:.2f}" '
                       f'y="{box_y:.1f}" width="{max(w, 0.5):.2f}" height="{BOX_H}" rx="2" '
                       f'fill="{COLORS[code]}" fill-opacity="{opacity:g}">'
                       f"<title>{escape(repr(t.step))} ({NAMES[code]}"
                       f"{', stage ' + str(t.step.stage_index) if several else ''})  "
                       f"{_fmt(t.start)}–{_fmt(t.end)}</title></rect>")
            text = str(t.step.micro_index)
            if kind.name == "FWD_BWD":
                back = t.step.backward
                out.append(f'<rect class="fb-backward" x="{x:.2f}" y="{box_y + BOX_H / 2:.1f}" '
                           f'width="{max(w, 0.5):.2f}" height="{BOX_H / 2:.1f}" rx="2" '
                           f'fill="{COLORS[back.type.value]}" fill-opacity="{opacity:g}" pointer-events="none"/>')
                text = f"{t.step.micro_index}|{back.micro_index}"
            if w >= CHAR_W * len(text) + 3:
                fill = "" if opacity > 0.7 else ' style="fill:#222222"'
                out.append(f'<text class="label"{fill} x="{x + w / 2:.2f}" y="{box_y + BOX_H / 2:.1f}">'
                           f"{text}</text>")

    out.append(f'<line class="axis" x1="{LEFT}" y1="{axis_y}" x2="{LEFT + plot_w:.1f}" y2="{axis_y}"/>')
    for k in range(n_ticks + 1):
        x = LEFT + k * tick * scale
        out.append(f'<line class="axis" x1="{x:.1f}" y1="{axis_y}" x2="{x:.1f}" y2="{axis_y + 5}"/>')
        out.append(f'<text x="{x:.1f}" y="{axis_y + 17}" text-anchor="middle">{_fmt(k * tick)}</text>')
    if time_unit:
        out.append(f'<text x="{LEFT - 8}" y="{axis_y + 17}" text-anchor="end">{escape(time_unit)}</text>')

    y = axis_y + 40
    x = LEFT
    used = {t.step.type.value for ts in compute.values() for t in ts}
    for code in ("F", "B", "I", "W", "FB"):
        if code not in used:
            continue
        out.append(f'<rect x="{x}" y="{y - 10}" width="14" height="12" rx="2" fill="{COLORS[code]}"/>')
        if code == "FB":
            out.append(f'<rect x="{x}" y="{y - 4}" width="14" height="6" rx="2" fill="{COLORS["B"]}"/>')
        out.append(f'<text x="{x + 19}" y="{y}">{code} {NAMES[code]}</text>')
        x += 34 + 6.2 * len(f"{code} {NAMES[code]}")
    out.append(f'<rect class="comm" x="{x}" y="{y - 5}" width="14" height="3"/>')
    out.append(f'<text x="{x + 19}" y="{y}">send/recv (incl. waiting)</text>')
    x += 34 + 6.2 * 25
    if any(len({t.step.stage_index for t in ts}) > 1 for ts in compute.values()):
        out.append(f'<text x="{x}" y="{y}">lighter box: a later stage of the same rank; number: microbatch</text>')
    else:
        out.append(f'<text x="{x}" y="{y}">number in box: microbatch</text>')
    unit = f" {time_unit}" if time_unit else ""
    summary = [f"makespan {_fmt(tl.makespan)}{unit}, bubble {tl.bubble_ratio:.1%} overall",
               "bubble per rank: " + ", ".join(f"{r}: {tl.bubble_per_rank[r]:.1%}" for r in ranks),
               "peak in-flight activations per rank: "
               + ", ".join(f"{r}: {tl.peak_in_flight.get(r, 0)}" for r in ranks)]
    for i, line in enumerate(summary):
        out.append(f'<text x="{LEFT}" y="{y + 20 + 18 * i}">{escape(line)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def save_svg(path: str, source, **kwargs) -> str:
    """Write ``render_svg(source, **kwargs)`` to ``path``; returns ``path``."""
    with open(path, "w") as f:
        f.write(render_svg(source, **kwargs))
    return path
