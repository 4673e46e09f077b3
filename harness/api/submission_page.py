"""What /submissions/{id} shows: the verdict and why, the source, the logs, every figure the judge kept."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from markupsafe import Markup
from pygments import format as format_tokens
from pygments.formatters import HtmlFormatter
from pygments.lexers import CudaLexer, PythonLexer
from pygments.token import String, _TokenType
from sqlalchemy.orm import Session

from harness.api import charts
from harness.api.pages import VERDICT_COLOURS
from harness.api.schemas import WorkerSilence
from harness.api.views import waits_for, worker_silence
from harness.config import Settings
from harness.db import queries
from harness.db.models import UNFINISHED_STATUSES, Job, Result, Submission
from harness.schema import EvalResult, OutputFigures, TimingStats, Tolerance
from harness.submission import InvalidSubmission, extract

REFRESH_S = 5  # while queued or running, the page reloads itself this often
_FORMATTER = HtmlFormatter(cssclass="hl", linenos="table", lineanchors="L", anchorlinenos=True, wrapcode=True)


_CUDA_HINTS = ("__global__", "#include", "torch::Tensor", "__device__")


def _tokens(source: str) -> Iterator[tuple[_TokenType, str]]:
    """Python tokens, except that the body of a triple-quoted string holding CUDA or C++ (what
    load_inline compiles, most of a submission) is lexed as CUDA."""
    cuda = CudaLexer(stripnl=False, ensurenl=False)
    tokens = iter(PythonLexer(stripnl=False).get_tokens(source))
    for ttype, value in tokens:
        if ttype not in String or value not in ('"""', "'''"):
            yield ttype, value
            continue
        body: list[tuple[_TokenType, str]] = []
        closing = None
        for t, v in tokens:
            if t in String and v == value:
                closing = (t, v)
                break
            body.append((t, v))
        text = "".join(v for _, v in body)
        yield ttype, value
        yield from cuda.get_tokens(text) if any(h in text for h in _CUDA_HINTS) else body
        if closing:
            yield closing


def highlighted(source: str) -> Markup:
    """The source as HTML with line numbers; pygments escapes every character of it."""
    return Markup(format_tokens(_tokens(source), _FORMATTER))  # noqa: S704 - pygments output is escaped


def highlight_css() -> str:
    return _FORMATTER.get_style_defs(".hl")


@dataclass
class Log:
    title: str
    text: str


@dataclass
class TrialLine:
    trial: int
    structure_error: str | None
    out: OutputFigures | None


@dataclass
class SubmissionPage:
    sub: Submission
    job: Job | None
    position: int | None
    row: Result | None
    result: EvalResult | None
    refresh_s: int | None
    verdict_colour: str
    source_html: Markup | None
    extract_error: str | None
    is_reply: bool
    logs: list[Log]
    trials: list[TrialLine]
    timing_svg: Markup | None
    timings: list[tuple[str, TimingStats]]
    waiting: WorkerSilence | None  # its worker has gone silent mid-evaluation
    workers_live: int  # workers heard from lately: with none, a queued job waits for one to start
    waits_for: str | None  # queued, and it needs what no live worker has ("waits for a GPU worker; ...")
    silent_after_s: float
    problem_tolerance: Tolerance | None  # the problem's tolerance now, where the result's differs from it


def _logs(r: EvalResult) -> list[Log]:
    o = r.observations
    logs = []
    if r.log_excerpt:
        logs.append(Log("Log excerpt (why this verdict)", r.log_excerpt))
    if o.static_error:
        logs.append(Log("Static check", o.static_error))
    err = o.candidate_error
    if err is not None:
        kind = "Compile log" if err.phase.value == "compile" else f"Error during {err.phase.value}"
        logs.append(Log(f"{kind}: {err.exc_type}", err.message))
        if err.traceback:
            logs.append(Log("Traceback", err.traceback))
    if o.log_tail:
        logs.append(Log("Run log (tail of the candidate's output)", o.log_tail))
    if o.reference_error:
        logs.append(Log("Reference side (the harness's fault)", o.reference_error))
    if o.compile_baseline_error:
        logs.append(Log("torch.compile baseline", o.compile_baseline_error))
    return logs


def submission_page(session: Session, sub: Submission, settings: Settings,
                    problem_tolerance: Tolerance | None) -> SubmissionPage:
    job = queries.latest_job(session, sub.id)
    position = queries.queue_position(session, job) if job else None
    row = queries.get_result(session, sub.current_result_id)
    result = EvalResult.model_validate(row.payload) if row else None
    source_html, extract_error = None, None
    try:
        source_html = highlighted(extract(sub.text).source)
    except InvalidSubmission as e:
        extract_error = str(e)
    trials: list[TrialLine] = []
    timings: list[tuple[str, TimingStats]] = []
    timing_svg = None
    if result is not None:
        o = result.observations
        for t in o.trials:
            trials += [TrialLine(t.trial, t.structure_error, out) for out in t.outputs] or [
                TrialLine(t.trial, t.structure_error, None)]
        timings = [(label, t) for label, t in (("candidate", o.candidate_timing), ("eager", o.eager_timing),
                                               ("torch.compile", o.compile_timing)) if t is not None]
        if timings:
            timing_svg = charts.timing_chart([
                charts.Spread(label, t.n, t.min_ms, t.median_ms, t.mean_ms, t.max_ms, t.std_ms, charts.colour(i))
                for i, (label, t) in enumerate(timings)], "timing distribution of the timed calls")
    unfinished = sub.status in UNFINISHED_STATUSES
    waiting = worker_silence(job, queries.db_now(session), settings.worker_silent_after_s)
    live = len(queries.live_workers(session, settings.worker_silent_after_s)) if unfinished else 0
    return SubmissionPage(
        sub=sub, job=job, position=position, row=row, result=result, refresh_s=REFRESH_S if unfinished else None,
        verdict_colour=VERDICT_COLOURS.get(sub.verdict or "pending", "#999"), source_html=source_html,
        extract_error=extract_error, is_reply=sub.text_kind == "reply", logs=_logs(result) if result else [],
        trials=trials, timing_svg=timing_svg, timings=timings, waiting=waiting, workers_live=live,
        waits_for=waits_for(session, settings.worker_silent_after_s, job) if job is not None and job.needs else None,
        silent_after_s=settings.worker_silent_after_s,
        problem_tolerance=problem_tolerance if result is None or problem_tolerance != result.tolerance else None)
