"""What the HTML pages show, assembled from stored rows: plain data for the templates, charts as SVG.

The numbers come from the same places as the JSON API's (`reporting`, `views`); this module only
chooses, filters, sorts and draws them.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from markupsafe import Markup
from sqlalchemy.orm import Session

from harness import reporting
from harness.api import charts
from harness.db import queries
from harness.db.models import UNFINISHED_STATUSES, Result, ResultOrigin, Submission
from harness.precision import DEFAULT_PRECISION, PRECISIONS
from harness.problems import Registry
from harness.problems.spec import ProblemSpec
from harness.reporting import Scored
from harness.schema import Tolerance
from harness.service.boards import BOARDS, boards_by_precision
from harness.verdicts import Verdict

DEVICES = BOARDS
GROUPINGS = ("model", "submitter", "pair")
ROW_LIMIT = 5000  # per problem page; more than a person reads, few enough to draw

# Fixed colours per verdict: the same on every page and chart.
VERDICT_COLOURS = {
    "passed": "#2e8b57", "flagged": "#d4a106", "wrong_answer": "#c0392b", "compile_error": "#e67e22",
    "runtime_error": "#a04000", "crashed": "#7b241c", "timeout": "#8e44ad", "shape_mismatch": "#d35d9c",
    "dtype_mismatch": "#b9770e", "nondeterministic": "#5d6d7e", "invalid_submission": "#95a5a6",
    "infra_error": "#bdc3c7", "pending": "#d0d7de",
}
VERDICT_ORDER = [v.value for v in Verdict]


def pick_precision(requested: str | None) -> str:
    """The precision a page shows: the one asked for where it is one, else fp32 (the default of every evaluation)."""
    return requested if requested in PRECISIONS else DEFAULT_PRECISION


def pick_device(requested: str | None, present: set[str | None]) -> str:
    if requested in DEVICES:
        return requested
    return "cpu" if "cuda" not in present and "cpu" in present else "cuda"


def sort_rows(rows: list[Any], key: str, descending: bool, keys: dict[str, Callable[[Any], Any]]) -> list[Any]:
    """Sort by one column; empty cells last whichever the direction."""
    get = keys[key]
    filled = [r for r in rows if get(r) is not None]
    empty = [r for r in rows if get(r) is None]
    return sorted(filled, key=get, reverse=descending) + empty


# ---- / ------------------------------------------------------------------------------------------------

@dataclass
class Best:
    speedup: float
    submission_id: int
    who: str
    flags: list[str] = field(default_factory=list)  # those a ranked result may carry (precision_below_fp32)


@dataclass
class ProblemSummary:
    spec: ProblemSpec
    submissions: int = 0
    pending: int = 0
    graded: int = 0
    passed: int = 0
    best_eager: Best | None = None
    best_compile: Best | None = None

    @property
    def pass_rate(self) -> float | None:
        return self.passed / self.graded if self.graded else None


HOME_SORTS: dict[str, Callable[[ProblemSummary], Any]] = {
    "problem": lambda r: r.spec.kernelbench_id or r.spec.id,
    "best_eager": lambda r: r.best_eager.speedup if r.best_eager else None,
    "best_compile": lambda r: r.best_compile.speedup if r.best_compile else None,
    "submissions": lambda r: r.submissions,
    "pass_rate": lambda r: r.pass_rate,
}


def _better(cur: Best | None, speedup: float | None, s: Scored) -> Best | None:
    if speedup is None or (cur is not None and cur.speedup >= speedup):
        return cur
    return Best(speedup, s.submission_id, f"{s.submitter} / {s.model}", list(s.flags))


@dataclass
class HomePage:
    device: str
    devices_present: list[str]
    precision: str
    precisions_present: list[str]
    baseline: str
    by: str
    problems: list[ProblemSummary]
    fast_p_svg: Markup
    legend: list[tuple[str, str, float, int, int]]  # label, colour, fast_1, correct, problems
    totals: dict[str, int] = field(default_factory=dict)


def model_colours(session: Session) -> dict[str, str]:
    """One colour per model on every page: a model keeps its colour from chart to chart."""
    return {m: charts.colour(i) for i, m in enumerate(queries.distinct_models(session))}


def labeller(by: str) -> Callable[[Scored], str]:
    """The label of a result's line on the fast_p chart (one function per grouping: it runs once per result)."""
    if by == "model":
        return lambda s: s.model
    if by == "submitter":
        return lambda s: s.submitter
    return lambda s: f"{s.submitter} / {s.model}"


def fast_p_series(results: Sequence[Scored], by: str, baseline: reporting.Baseline
                  ) -> list[tuple[str, list[Scored]]]:
    """Per group, the best result on each problem it attempted (reporting.best_per_problem)."""
    groups: dict[str, list[Scored]] = defaultdict(list)
    label = labeller(by)
    for s in results:
        groups[label(s)].append(s)
    return [(label, reporting.best_per_problem(groups[label], baseline)) for label in sorted(groups)]


def home_page(session: Session, registry: Registry, *, device: str | None, baseline: reporting.Baseline, by: str,
              sort: str, descending: bool, precision: str | None = None) -> HomePage:
    by_precision = boards_by_precision(session, registry)
    prec = pick_precision(precision)
    boards = by_precision[prec]
    present = {board for board, results in boards.items() if results}
    dev = pick_device(device, present)
    results = boards[dev]
    summaries = {spec.id: ProblemSummary(spec) for spec in registry.all()}
    counts = queries.submission_counts(session)
    for pid, (total, pending) in counts.items():
        if pid in summaries:
            summaries[pid].submissions, summaries[pid].pending = total, pending
    for s in results:
        row = summaries.get(s.problem_id)
        if row is None:
            continue
        row.graded += 1
        row.passed += s.correct
        if s.rankable:
            row.best_eager = _better(row.best_eager, s.speedup_vs_eager, s)
            row.best_compile = _better(row.best_compile, s.speedup_vs_compile, s)
    series, legend = [], []
    groups = fast_p_series(results, by, baseline)
    colours = model_colours(session) if by == "model" else {label: charts.colour(i) for i, (label, _) in
                                                            enumerate(groups)}
    for label, best in groups:
        speeds = [s.counted_speedup(baseline) for s in best if s.correct]  # not vouched for: counts at p = 0 only
        series.append(charts.Series(label, charts.step_points(speeds, len(best), 3.0), colours[label]))
        legend.append((label, colours[label], reporting.fast_p(best, 1.0, baseline), sum(s.correct for s in best),
                       len(best)))
    title = f"fast_p vs {'torch.compile' if baseline == 'compile' else 'eager'}, one line per {by}"
    problems = sort_rows(list(summaries.values()), sort, descending, HOME_SORTS)
    return HomePage(device=dev, devices_present=sorted(present), baseline=baseline, precision=prec,
                    precisions_present=[p for p in PRECISIONS if any(by_precision[p].values())],
                    by=by, problems=problems, fast_p_svg=charts.fast_p_chart(series, 3.0, title), legend=legend,
                    totals={"submissions": sum(t for t, _ in counts.values()), "results": len(results)})


# ---- /problems/{id} -----------------------------------------------------------------------------------

@dataclass
class ResultRow:
    submission_id: int
    submitter: str
    model: str
    status: str
    verdict: str | None
    message: str | None
    device: str | None
    device_name: str | None
    precision: str
    speedup_vs_eager: float | None
    speedup_vs_compile: float | None
    candidate_ms: float | None
    max_abs_err: float | None
    err_vs_fp64: float | None
    ref_err_vs_fp64: float | None
    flags: list[str]
    created_at: datetime
    tolerance: Tolerance | None  # the one it was graded at
    regraded: bool
    rank: int | None = None

    @property
    def precision_ratio(self) -> float | None:
        if self.err_vs_fp64 is None or not self.ref_err_vs_fp64:
            return None
        return self.err_vs_fp64 / self.ref_err_vs_fp64


PROBLEM_SORTS: dict[str, Callable[[ResultRow], Any]] = {
    "rank": lambda r: r.rank, "submitter": lambda r: r.submitter.lower(), "model": lambda r: r.model.lower(),
    "verdict": lambda r: r.verdict, "speedup_eager": lambda r: r.speedup_vs_eager,
    "speedup_compile": lambda r: r.speedup_vs_compile, "time": lambda r: r.candidate_ms,
    "error": lambda r: r.err_vs_fp64, "submitted": lambda r: r.created_at, "id": lambda r: r.submission_id,
}
# The direction a first click sorts in: the best first.
DEFAULT_DESCENDING = {"speedup_eager", "speedup_compile", "submitted", "id", "best_eager", "best_compile",
                      "submissions", "pass_rate"}


def result_row(sub: Submission, res: Result | None) -> ResultRow:
    """A results-table row from columns only: a page lists thousands and a payload is large to parse."""
    return ResultRow(
        submission_id=sub.id, submitter=sub.submitter, model=sub.model, status=sub.status, verdict=sub.verdict,
        message=res.message if res else None, device=res.device if res else None,
        device_name=res.device_name if res else None, precision=res.precision if res else sub.precision,
        speedup_vs_eager=res.speedup_vs_eager if res else None,
        speedup_vs_compile=res.speedup_vs_compile if res else None,
        candidate_ms=res.candidate_ms if res else None, created_at=sub.created_at,
        flags=list(res.flags or []) if res else [],
        tolerance=Tolerance(atol=res.atol, rtol=res.rtol) if res else None,
        regraded=res is not None and res.origin == ResultOrigin.regrade.value,
        max_abs_err=res.max_abs_err if res else None, err_vs_fp64=res.err_vs_fp64 if res else None,
        ref_err_vs_fp64=res.ref_err_vs_fp64 if res else None)


@dataclass
class ProblemPage:
    spec: ProblemSpec
    device: str
    devices_present: list[str]
    precision: str
    precisions_present: list[str]
    rows: list[ResultRow]
    shown_of: int
    models: list[str]
    verdicts: list[tuple[str, int, str]]  # verdict, count, colour (the whole problem, this device class)
    pending: int
    verdict_svg: Markup
    speedup_svg: Markup
    baselines: list[queries.BaselineTime]
    degenerate: list[queries.DegenerateAt]
    filters: dict[str, str | None]


def problem_page(session: Session, registry: Registry, spec: ProblemSpec, *, device: str | None, model: str | None,
                 verdict: str | None, sort: str, descending: bool, precision: str | None = None) -> ProblemPage:
    pairs, _ = queries.list_submissions(session, queries.SubmissionFilter(problem_id=spec.id), limit=ROW_LIMIT,
                                        offset=0, with_text=False)
    rows = [result_row(sub, res) for sub, res in pairs
            if res is None or res.problem_version == spec.version]
    # Results of one precision at a time, as the boards rank them (an fp16 speedup is over the fp16 reference).
    precisions_present = [p for p in PRECISIONS if any(r.precision == p for r in rows)]
    prec = pick_precision(precision)
    rows = [r for r in rows if r.precision == prec]
    dev = pick_device(device, {r.device for r in rows if r.verdict})
    # This page lists the problem's submissions: one that never ran (queued, invalid) is on no board, so
    # it is listed under either device, and only the boards (home page, /api/leaderboard) leave it out.
    rows = [r for r in rows if r.device in (None, dev)]
    ranked = sorted((r for r in rows if reporting.ranked(r.verdict, r.flags) and r.speedup_vs_eager is not None),
                    key=lambda r: (-(r.speedup_vs_eager or 0.0), r.created_at))
    for i, r in enumerate(ranked, 1):
        r.rank = i
    models = sorted({r.model for r in rows})
    model_colour = model_colours(session)
    counts = Counter(r.verdict for r in rows if r.verdict and r.status not in UNFINISHED_STATUSES)
    pending = sum(1 for r in rows if r.status in UNFINISHED_STATUSES)
    verdicts = [(v, counts[v], VERDICT_COLOURS[v]) for v in VERDICT_ORDER if counts[v]]
    shares = [charts.Share(v, n, c) for v, n, c in verdicts]
    if pending:
        shares.append(charts.Share("queued or running", pending, VERDICT_COLOURS["pending"]))
    strips = []
    for m in models:
        mine = [r for r in ranked if r.model == m]
        if mine:
            strips.append(charts.Strip(m, [r.speedup_vs_eager or 0.0 for r in mine], model_colour[m],
                                       [f"/submissions/{r.submission_id}" for r in mine]))
    shown = [r for r in rows if (model is None or r.model == model) and (
        verdict is None or (r.verdict or "pending") == verdict or (verdict == "pending" and r.verdict is None))]
    return ProblemPage(
        spec=spec, device=dev, devices_present=sorted({r.device for r in rows if r.device}), precision=prec,
        precisions_present=precisions_present,
        rows=sort_rows(shown, sort, descending, PROBLEM_SORTS), shown_of=len(rows), models=models,
        verdicts=verdicts, pending=pending, verdict_svg=charts.stacked_bar(shares, "verdict breakdown"),
        speedup_svg=charts.speedup_strips(strips, "speedup vs eager of ranked results, one row per model"),
        baselines=[b for b in queries.baseline_times(session, spec.id, spec.version)
                   if b.device == dev and b.precision == prec],
        degenerate=[d for d in queries.degenerate_at(session, spec.id, spec.version) if d.device == dev],
        filters={"model": model, "verdict": verdict})
