"""Charts as inline SVG, drawn on the server: the pages need no JavaScript and no chart library.

Every function takes plain numbers and labels and returns `Markup`; every label passes through
`escape`, so a submitter or model name cannot add markup to the page.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from markupsafe import Markup, escape

# Okabe-Ito, then Tableau: distinguishable, also for the common colour-vision deficiencies.
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#7a7a7a", "#F0E442",
           "#4E79A7", "#B07AA1")


def colour(i: int) -> str:
    return PALETTE[i % len(PALETTE)]


def _f(x: float) -> str:
    return f"{x:.1f}".rstrip("0").rstrip(".")


@dataclass
class _Frame:
    """A plot area inside a viewBox: data coordinates to SVG coordinates."""

    width: int
    height: int
    left: int
    right: int
    top: int
    bottom: int

    @property
    def x0(self) -> float:
        return self.left

    @property
    def x1(self) -> float:
        return self.width - self.right

    @property
    def y0(self) -> float:
        return self.height - self.bottom

    @property
    def y1(self) -> float:
        return self.top


def _svg(frame: _Frame, title: str, body: list[str], css_class: str) -> Markup:
    return Markup(  # noqa: S704 - every piece of text in body was escaped where it was made
        f'<svg class="chart {css_class}" viewBox="0 0 {frame.width} {frame.height}" role="img" '
        f'preserveAspectRatio="xMidYMid meet" xmlns="http://www.w3.org/2000/svg"><title>{escape(title)}</title>'
        + "".join(body) + "</svg>")


def _text(x: float, y: float, s: str, cls: str = "", anchor: str = "middle") -> str:
    return f'<text x="{_f(x)}" y="{_f(y)}" text-anchor="{anchor}" class="{cls}">{escape(s)}</text>'


@dataclass
class Series:
    label: str
    points: list[tuple[float, float]]  # (x, y) in data units
    colour: str


def step_points(values: Sequence[float | None], n: int, p_max: float) -> list[tuple[float, float]]:
    """fast_p(p) for p in [0, p_max] as the corners of a step function.

    `values` are the speedups of the correct results (None: correct but untimed), `n` the number of
    problems; fast_p(p) = share correct with speedup > p, and fast_p(0) = share correct.
    """
    if n == 0:
        return [(0.0, 0.0), (p_max, 0.0)]
    timed = sorted(v for v in values if v is not None)
    pts = [(0.0, len(values) / n)]
    level = sum(1 for v in timed if v > 0) / n
    if level != pts[0][1]:
        pts.append((0.0, level))
    for v in timed:
        if 0 < v <= p_max:
            below = sum(1 for w in timed if w > v) / n
            if below != level:
                pts += [(v, level), (v, below)]
                level = below
    pts.append((p_max, level))
    return pts


def fast_p_chart(series: Sequence[Series], p_max: float = 3.0, title: str = "fast_p") -> Markup:
    """One step line per series: the share of problems solved correctly and more than p times faster."""
    fr = _Frame(width=640, height=306, left=64, right=22, top=14, bottom=46)

    def sx(p: float) -> float:
        return fr.x0 + (fr.x1 - fr.x0) * p / p_max

    def sy(share: float) -> float:
        return fr.y0 - (fr.y0 - fr.y1) * share

    body = ['<g class="grid">']
    for q in (0, 0.25, 0.5, 0.75, 1.0):
        body.append(f'<line x1="{_f(fr.x0)}" x2="{_f(fr.x1)}" y1="{_f(sy(q))}" y2="{_f(sy(q))}"/>')
        body.append(_text(fr.x0 - 8, sy(q) + 4, f"{q:.0%}", "tick", "end"))
    steps = round(p_max / 0.5)
    for i in range(steps + 1):
        p = i * 0.5
        body.append(f'<line x1="{_f(sx(p))}" x2="{_f(sx(p))}" y1="{_f(fr.y0)}" y2="{_f(fr.y1)}"/>')
        body.append(_text(sx(p), fr.y0 + 20, f"{p:g}×", "tick"))
    body.append("</g>")
    body.append(f'<line class="marker" x1="{_f(sx(1))}" x2="{_f(sx(1))}" y1="{_f(fr.y0)}" y2="{_f(fr.y1)}"/>')
    body.append(_text((fr.x0 + fr.x1) / 2, fr.height - 4, "p: speedup over the baseline", "axis"))
    for s in series:
        d = " ".join(("M" if i == 0 else "L") + f"{_f(sx(x))},{_f(sy(y))}" for i, (x, y) in enumerate(s.points))
        body.append(f'<path class="series" data-series="{escape(s.label)}" d="{d}" stroke="{s.colour}">'
                    f'<title>{escape(s.label)}</title></path>')
    if not series:
        body.append(_text((fr.x0 + fr.x1) / 2, (fr.y0 + fr.y1) / 2, "no results yet", "empty"))
    return _svg(fr, title, body, "fast-p")


@dataclass
class Strip:
    label: str
    values: list[float]
    colour: str
    links: list[str] | None = None  # one URL per value


def _log_range(values: Sequence[float]) -> tuple[float, float]:
    lo = min([*values, 0.5])
    hi = max([*values, 2.0])
    return 2 ** math.floor(math.log2(lo)), 2 ** math.ceil(math.log2(hi))


def speedup_strips(strips: Sequence[Strip], title: str = "speedups", reference: float = 1.0) -> Markup:
    """One row of dots per label on a log axis of speedup, with a line at `reference` (1×: as fast)."""
    rows = max(len(strips), 1)
    row_h = 42
    fr = _Frame(width=640, height=30 + row_h * rows + 40, left=24, right=24, top=30, bottom=40)
    values = [v for s in strips for v in s.values if v > 0]
    lo, hi = _log_range(values or [1.0])

    def sx(v: float) -> float:
        return fr.x0 + (fr.x1 - fr.x0) * (math.log2(v) - math.log2(lo)) / (math.log2(hi) - math.log2(lo))

    body = ['<g class="grid">']
    tick = lo
    while tick <= hi * 1.0001:
        body.append(f'<line x1="{_f(sx(tick))}" x2="{_f(sx(tick))}" y1="{_f(fr.y0)}" y2="{_f(fr.y1)}"/>')
        body.append(_text(sx(tick), fr.y0 + 20, f"{tick:g}×", "tick"))
        tick *= 2
    body.append("</g>")
    body.append(f'<line class="marker" x1="{_f(sx(reference))}" x2="{_f(sx(reference))}" y1="{_f(fr.y0)}" '
                f'y2="{_f(fr.y1 - 8)}"/>')
    body.append(_text(sx(reference), fr.y1 - 12, "as fast as the baseline", "tick"))
    for i, s in enumerate(strips):
        y = fr.y1 + row_h * i + row_h / 2
        body.append(_text(fr.x0, y - 8, s.label, "strip-label", "start"))
        body.append(f'<g class="strip" data-series="{escape(s.label)}" fill="{s.colour}">')
        for j, v in enumerate(s.values):
            if v <= 0:
                continue
            dot = (f'<circle cx="{_f(sx(v))}" cy="{_f(y + 9)}" r="6"><title>{escape(s.label)}: {v:.3f}×'
                   "</title></circle>")
            if s.links:
                dot = f'<a href="{escape(s.links[j])}">{dot}</a>'
            body.append(dot)
        body.append("</g>")
    if not values:
        body.append(_text((fr.x0 + fr.x1) / 2, fr.y1 + row_h / 2, "no passing results yet", "empty"))
    body.append(_text((fr.x0 + fr.x1) / 2, fr.height - 4, "speedup (log scale)", "axis"))
    return _svg(fr, title, body, "strips")


@dataclass
class Share:
    label: str
    count: int
    colour: str


def stacked_bar(parts: Sequence[Share], title: str = "verdicts") -> Markup:
    """One horizontal bar split by count: the verdict breakdown."""
    fr = _Frame(width=640, height=36, left=0, right=0, top=0, bottom=0)
    total = sum(p.count for p in parts)
    body = []
    x = 0.0
    for p in parts:
        if p.count <= 0:
            continue
        w = fr.width * p.count / total
        body.append(f'<rect x="{_f(x)}" y="0" width="{_f(w)}" height="36" fill="{p.colour}">'
                    f"<title>{escape(p.label)}: {p.count}</title></rect>")
        if w > 28:
            body.append(_text(x + w / 2, 23, str(p.count), "bar-label"))
        x += w
    if not total:
        body.append(_text(fr.width / 2, 23, "no results yet", "empty"))
    return _svg(fr, title, body, "stacked")


@dataclass
class Spread:
    """Summary statistics of timed calls (the raw samples are not stored)."""

    label: str
    n: int
    min: float
    median: float
    mean: float
    max: float
    std: float
    colour: str


def timing_chart(rows: Sequence[Spread], title: str = "timing") -> Markup:
    """Per row: a min–max whisker, a mean ± std box and a median tick. The axis spans the data (it does
    not start at 0): the spread of one kernel's calls is what this chart is for."""
    row_h = 46
    fr = _Frame(width=640, height=14 + row_h * max(len(rows), 1) + 40, left=24, right=90, top=14, bottom=40)
    lo_data = min((r.min for r in rows), default=0.0)
    hi_data = max((r.max for r in rows), default=1.0)
    step = _nice_step(max(hi_data - lo_data, hi_data * 0.02, 1e-9) / 4)
    lo = math.floor(lo_data / step) * step
    hi = max(math.ceil(hi_data / step) * step, lo + step)

    def sx(ms: float) -> float:
        return fr.x0 + (fr.x1 - fr.x0) * (ms - lo) / (hi - lo)

    body = ['<g class="grid">']
    t = lo
    while t <= hi + step / 2:
        body.append(f'<line x1="{_f(sx(t))}" x2="{_f(sx(t))}" y1="{_f(fr.y0)}" y2="{_f(fr.y1)}"/>')
        body.append(_text(sx(t), fr.y0 + 20, f"{t:.4g}", "tick"))
        t += step
    body.append("</g>")
    for i, r in enumerate(rows):
        y = fr.y1 + row_h * i + row_h / 2 + 6
        box_lo, box_hi = max(r.mean - r.std, r.min), min(r.mean + r.std, r.max)
        body.append(f'<g class="spread" data-series="{escape(r.label)}">'
                    f"<title>{escape(r.label)}: median {r.median:.4g} ms, mean {r.mean:.4g} ± {r.std:.2g}, "
                    f"min {r.min:.4g}, max {r.max:.4g} ({r.n} calls)</title>")
        body.append(_text(fr.x0, y - 14, r.label, "strip-label", "start"))
        body.append(f'<line class="whisker" x1="{_f(sx(r.min))}" x2="{_f(sx(r.max))}" y1="{_f(y)}" y2="{_f(y)}"/>')
        body.append(f'<rect x="{_f(sx(box_lo))}" y="{_f(y - 7)}" width="{_f(max(sx(box_hi) - sx(box_lo), 2))}" '
                    f'height="14" fill="{r.colour}" opacity="0.35"/>')
        body.append(f'<line class="median" x1="{_f(sx(r.median))}" x2="{_f(sx(r.median))}" y1="{_f(y - 10)}" '
                    f'y2="{_f(y + 10)}" stroke="{r.colour}"/>')
        body.append(_text(sx(r.max) + 6, y + 4, f"{r.median:.3g} ms", "tick", "start"))
        body.append("</g>")
    if not rows:
        body.append(_text((fr.x0 + fr.x1) / 2, fr.y1 + row_h / 2, "not timed", "empty"))
    body.append(_text((fr.x0 + fr.x1) / 2, fr.height - 4, "milliseconds per call", "axis"))
    return _svg(fr, title, body, "timing")


def _nice_step(raw: float) -> float:
    if raw <= 0:
        return 1.0
    mag = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 2.5, 5, 10):
        if raw <= m * mag:
            return m * mag
    return 10 * mag
