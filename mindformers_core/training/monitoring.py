"""What a run leaves for people to look at besides loss.jsonl: TensorBoard event files and a loss-curve picture.

- :class:`TensorBoardLog` writes each step's record (the same dict as a loss.jsonl line) as scalars with
  tensorboardX's ``SummaryWriter`` — the writer MindFormers itself uses — under MindFormers' tag names:
  ``loss``, ``learning-rate``, ``grad-norm``, ``throughput`` (tokens/s of the whole job), ``iteration-time``
  (with ``log_timers_to_tensorboard``), ``eval-loss``, and for MoE models ``load-balancing-loss``,
  ``expert-load-min``/``-max`` and ``expert-load/layer_<i>/ep_<j>`` (tokens per expert per micro-batch).
  Only rank 0 writes: every value logged is the job's (the same on each rank).
- :func:`write_loss_svg` draws loss.jsonl's loss (and eval loss) against the step as a small SVG, written by
  us (no plotting library is a dependency), next to loss.jsonl at the end of a run.
"""
from __future__ import annotations

import json
import math
import os
from typing import Any, Dict, List, Optional, Sequence, Tuple
from xml.sax.saxutils import escape

# record field -> TensorBoard tag (MindFormers' MFLossMonitor names where it has one)
SCALAR_TAGS = {"loss": "loss", "lr": "learning-rate", "grad_norm": "grad-norm", "tokens_per_s": "throughput",
               "eval_loss": "eval-loss", "aux_loss": "load-balancing-loss", "expert_load_min": "expert-load-min",
               "expert_load_max": "expert-load-max", "mtp_loss": "mtp-loss"}


class TensorBoardLog:
    """Event files in ``directory`` from step records; a no-op object when ``directory`` is empty or the
    rank is not 0. ``queue_size``: events buffered before a write; ``interval``: write every N steps."""

    def __init__(self, directory: Optional[str], rank: int, queue_size: int = 10, interval: int = 1,
                 timers: bool = False, expert_load: bool = True):
        self.directory = os.path.abspath(directory) if directory and rank == 0 else None
        self.interval, self.timers, self.expert_load = max(1, int(interval)), timers, expert_load
        self.writer = None
        if self.directory is not None:
            try:
                from tensorboardX import SummaryWriter     # imported only when asked for
            except ImportError:
                from .config import ConfigError
                raise ConfigError([f"tensorboard.tensorboard_dir = {directory!r}: writing event files needs "
                                   "tensorboardX (pip install tensorboardX==2.6.5), or set it to null"]) from None
            os.makedirs(self.directory, exist_ok=True)
            self.writer = SummaryWriter(logdir=self.directory, max_queue=int(queue_size), flush_secs=30)

    @classmethod
    def from_config(cls, cfg, rank: int) -> "TensorBoardLog":
        tb = cfg.get("tensorboard") or {}
        return cls(tb.get("tensorboard_dir") or None, rank, int(tb.get("tensorboard_queue_size", 10)),
                   int(tb.get("log_interval", 1)), bool(tb.get("log_timers_to_tensorboard", False)),
                   bool(tb.get("log_expert_load_to_tensorboard", True)))

    def __bool__(self) -> bool:
        return self.writer is not None

    def write(self, record: Dict[str, Any]) -> None:
        """One step's record (as in loss.jsonl); values that are missing or null (a NaN loss) are left out."""
        step = int(record["step"])
        if self.writer is None or step % self.interval:
            return
        for field, tag in SCALAR_TAGS.items():
            value = record.get(field)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                self.writer.add_scalar(tag, float(value), global_step=step)
        if self.timers and "step_time_s" in record:
            self.writer.add_scalar("iteration-time", float(record["step_time_s"]), global_step=step)
        if self.expert_load:
            for layer, loads in enumerate(record.get("expert_load") or []):
                for expert, value in enumerate(loads):
                    self.writer.add_scalar(f"expert-load/layer_{layer}/ep_{expert}", float(value), global_step=step)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.flush()
            self.writer.close()
            self.writer = None


# ------------------------------------------------------------------------------------------------ loss curve
def read_loss_log(path: str) -> List[Dict[str, Any]]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _ticks(lo: float, hi: float, n: int = 5) -> List[float]:
    """About ``n`` round values covering [lo, hi]."""
    if hi <= lo:
        return [lo]
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step) * step
    return [first + i * step for i in range(int((hi - first) / step + 1e-9) + 1)]


def _fmt(v: float) -> str:
    return f"{v:.4g}"


def loss_svg(steps: Sequence[int], losses: Sequence[float], title: str = "training loss",
             eval_points: Sequence[Tuple[int, float]] = (), width: int = 640, height: int = 360) -> str:
    """An SVG line chart of ``losses`` (finite values) over ``steps``, with axes, ticks and eval points."""
    pts = [(s, v) for s, v in zip(steps, losses) if v is not None and math.isfinite(v)]
    left, right, top, bottom = 64, 16, 32, 40
    w, h = width - left - right, height - top - bottom
    values = [v for _, v in pts] + [v for _, v in eval_points]
    xs = [s for s, _ in pts] + [s for s, _ in eval_points]
    x0, x1 = (min(xs), max(xs)) if xs else (0, 1)
    y0, y1 = (min(values), max(values)) if values else (0.0, 1.0)
    if x1 == x0:
        x0, x1 = x0 - 1, x1 + 1
    if y1 == y0:
        y0, y1 = y0 - 0.5, y1 + 0.5
    pad = (y1 - y0) * 0.05
    y0, y1 = y0 - pad, y1 + pad

    def X(s: float) -> float:
        return left + (s - x0) / (x1 - x0) * w

    def Y(v: float) -> float:
        return top + (y1 - v) / (y1 - y0) * h

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">',
           f'<title>{escape(title)}</title>',
           f'<rect x="0" y="0" width="{width}" height="{height}" fill="white"/>',
           f'<text x="{left + w / 2:.1f}" y="18" text-anchor="middle" font-size="13">{escape(title)}</text>',
           f'<g id="axes" stroke="#444" fill="none"><path d="M{left},{top} V{top + h} H{left + w}"/></g>']
    grid = ['<g id="ticks">']
    for v in _ticks(y0, y1):
        grid.append(f'<line x1="{left}" x2="{left + w}" y1="{Y(v):.2f}" y2="{Y(v):.2f}" stroke="#e4e4e4"/>'
                    f'<text x="{left - 6}" y="{Y(v) + 4:.2f}" text-anchor="end">{_fmt(v)}</text>')
    for s in _ticks(x0, x1):
        grid.append(f'<text x="{X(s):.2f}" y="{top + h + 16}" text-anchor="middle">{_fmt(s)}</text>')
    grid.append("</g>")
    out += grid
    out.append(f'<text x="{left + w / 2:.1f}" y="{height - 6}" text-anchor="middle">step</text>')
    out.append(f'<text x="14" y="{top + h / 2:.1f}" text-anchor="middle" '
               f'transform="rotate(-90 14 {top + h / 2:.1f})">loss</text>')
    if pts:
        coords = " ".join(f"{X(s):.2f},{Y(v):.2f}" for s, v in pts)
        data = " ".join(f"{s}:{v!r}" for s, v in pts)
        out.append(f'<polyline id="loss" fill="none" stroke="#1f77b4" stroke-width="1.5" points="{coords}" '
                   f'data-steps-losses="{data}"/>')
    if eval_points:
        out.append('<g id="eval_loss" fill="#d62728">' + "".join(
            f'<circle cx="{X(s):.2f}" cy="{Y(v):.2f}" r="3" data-step="{s}" data-loss="{v!r}"/>'
            for s, v in eval_points) + "</g>")
        out.append(f'<text x="{left + w - 4}" y="{top + 12}" text-anchor="end" fill="#d62728">● eval loss</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def write_loss_svg(jsonl_path: str, svg_path: Optional[str] = None, title: Optional[str] = None) -> Optional[str]:
    """Draw loss.jsonl (the whole file: a resumed run's earlier steps too) into ``svg_path`` (default: the
    same name with ``.svg``), written atomically; returns the path, or None when the log is missing or empty."""
    if not os.path.exists(jsonl_path):
        return None
    records = read_loss_log(jsonl_path)
    if not records:
        return None
    svg_path = svg_path or os.path.splitext(jsonl_path)[0] + ".svg"
    first, last = records[0], records[-1]
    title = title or f"training loss, steps {first['step']}..{last['step']}"
    text = loss_svg([r["step"] for r in records], [r.get("loss") for r in records], title,
                    [(r["step"], r["eval_loss"]) for r in records if r.get("eval_loss") is not None])
    with open(svg_path + ".tmp", "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(svg_path + ".tmp", svg_path)
    return svg_path
