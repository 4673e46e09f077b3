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


# Tick families for a log axis of speedups, densest first: the first that labels the range in at most
# MAX_LOG_TICKS ticks is used. Each maps an integer k to the k-th tick.
_LOG_FAMILIES = (
    lambda k: 2.0 ** k,  # 0.25x 0.5x 1x 2x 4x
    lambda k: (1, 2, 5)[k % 3] * 10.0 ** (k // 3),  # 0.1x 0.2x 0.5x 1x 2x 5x
    lambda k: 10.0 ** k,  # 0.01x 0.1x 1x 10x 100x
    lambda k: 100.0 ** k,
    lambda k: 1000.0 ** k,
)
# Labels of a 640-wide chart drawn at a phone's width need ~100 units each (see style.css).
MAX_LOG_TICKS = 6


def log_ticks(values: Sequence[float]) -> list[float]:
    """Round ticks of a log axis that spans `values` and 1x (at least 0.5x to 2x): the first family of
    _LOG_FAMILIES that does it in at most MAX_LOG_TICKS; the first and last tick are the axis' ends."""
    lo, hi = min([*values, 0.5]), max([*values, 2.0])
    for tick in _LOG_FAMILIES:
        # Each family grows by k; start from a k at or below lo and walk up past hi.
        k = 0
        while tick(k) > lo:
            k -= 1
        while tick(k + 1) <= lo:
            k += 1
        ticks = [tick(k)]
        while ticks[-1] < hi and len(ticks) <= MAX_LOG_TICKS:
            k += 1
            ticks.append(tick(k))
        if len(ticks) <= MAX_LOG_TICKS:
            return ticks
    return [10.0 ** math.floor(math.log10(lo)), 10.0 ** math.ceil(math.log10(hi))]


def speedup_label(v: float) -> str:
    """A tick's label: 0.01x, 0.25x, 1x, 10x, 100x (round values only: ticks are chosen to be round)."""
    return f"{v:.10g}×"


def speedup_strips(strips: Sequence[Strip], title: str = "speedups", reference: float = 1.0) -> Markup:
    """One band per label, its name above its own dots, on a log axis of speedup with a line at
    `reference` (1×: as fast). The bands alternate in shade, so each name sits with its dots."""
    rows = max(len(strips), 1)
    row_h = 50
    # Margins hold half of an end tick's label at a phone's font size (style.css), and the axis title.
    fr = _Frame(width=640, height=30 + row_h * rows + 50, left=36, right=36, top=30, bottom=50)
    values = [v for s in strips for v in s.values if v > 0]
    ticks = log_ticks(values or [1.0])
    lo, hi = ticks[0], ticks[-1]

    def sx(v: float) -> float:
        return fr.x0 + (fr.x1 - fr.x0) * (math.log(v) - math.log(lo)) / (math.log(hi) - math.log(lo))

    body = []
    for i in range(len(strips)):
        top = fr.y1 + row_h * i
        body.append(f'<rect class="band{" odd" if i % 2 else ""}" x="0" y="{_f(top)}" width="{fr.width}" '
                    f'height="{row_h}"/>')
    body.append('<g class="grid">')
    for t in ticks:
        body.append(f'<line x1="{_f(sx(t))}" x2="{_f(sx(t))}" y1="{_f(fr.y0)}" y2="{_f(fr.y1)}"/>')
        body.append(_text(sx(t), fr.y0 + 22, speedup_label(t), "tick"))
    body.append("</g>")
    body.append(f'<line class="marker" x1="{_f(sx(reference))}" x2="{_f(sx(reference))}" y1="{_f(fr.y0)}" '
                f'y2="{_f(fr.y1 - 8)}"/>')
    body.append(_text(sx(reference), fr.y1 - 12, "as fast as the baseline", "tick"))
    for i, s in enumerate(strips):
        top = fr.y1 + row_h * i
        body.append(f'<g class="strip" data-series="{escape(s.label)}" fill="{s.colour}">')
        body.append(_text(8, top + 19, s.label, "strip-label", "start"))
        for j, v in enumerate(s.values):
            if v <= 0:
                continue
            dot = (f'<circle cx="{_f(sx(v))}" cy="{_f(top + row_h - 14)}" r="6"><title>{escape(s.label)}: '
                   f"{v:.3f}×</title></circle>")
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
