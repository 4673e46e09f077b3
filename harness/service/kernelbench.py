"""A run of ours in KernelBench's terms: its results as KernelBench samples, KernelBench's metrics over each level,
and exports in KernelBench's formats (harness/kernelbench_format.py).

A run is a set of stored submissions: an eval-dir batch, or those of a model (and tag, submitter). A result
counts as KernelBench counts one (harness/kernelbench_metrics.py), except that the harness's own failures
(infra_error) are left out as if the sample were missing, never counted as the model's.

A sample's number is the one eval-dir stored (the file's `sample_<S>`); a submission without one is numbered
by its place among its problem's others, in the order they were submitted. Where two results claim one sample,
the later submission's counts.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ValidationError
from sqlalchemy.orm import Session

from harness import kernelbench_format as kbf
from harness.db import queries
from harness.db.models import Result, Submission
from harness.kernelbench_metrics import THRESHOLDS, KernelBenchMetrics, Sample, level_metrics
from harness.problems import Registry, UnknownProblem
from harness.problems.spec import ProblemSpec
from harness.reporting import Scored, best_per_problem, fast_p_curve, ranked, reference_vouched
from harness.schema import TimingStats
from harness.verdicts import Phase, Verdict

Baseline = Literal["eager", "compile"]
_KB_ID = re.compile(r"^level(\d+)/(\d+)$")
NOT_COMPILED = {Verdict.invalid_submission.value, Verdict.compile_error.value}


def kernelbench_place(spec: ProblemSpec | None) -> tuple[int, int] | None:
    """(level, number) of a KernelBench problem; None for a problem that is not one."""
    m = _KB_ID.match(spec.kernelbench_id or "") if spec is not None else None
    return (int(m.group(1)), int(m.group(2))) if m else None


@dataclass
class RunSample:
    """One stored result seen as a KernelBench sample."""

    level: int
    problem: int
    sample: int
    spec: ProblemSpec
    submission_id: int
    verdict: str
    message: str
    flags: list[str]
    device: str | None
    device_name: str | None
    size: str
    timing: TimingStats | None  # the candidate's
    compiled: bool
    precision: str = "fp32"  # a baseline is the reference's at the same precision
    speedup_vs_eager: float | None = None  # as its own evaluation measured them (our view)
    speedup_vs_compile: float | None = None

    @property
    def correct(self) -> bool:
        return self.verdict == Verdict.passed.value

    @property
    def vouched(self) -> bool:
        return ranked(self.verdict, self.flags)

    def kb(self) -> Sample:
        return Sample(problem=self.problem, sample=self.sample, compiled=self.compiled, correct=self.correct,
                      runtime_ms=self.timing.mean_ms if self.timing is not None else None, vouched=self.vouched)

    def entry(self) -> dict[str, Any]:
        meta: dict[str, Any] = {"hardware": self.device_name, "device": self.device, "verdict": self.verdict,
                                "message": self.message, "flags": self.flags,
                                "timing_vouched": self.timing is not None and self.vouched,
                                "submission_id": self.submission_id, "problem_id": self.spec.id, "size": self.size}
        if not self.compiled:
            meta["compilation_error"] = self.message
        elif not self.correct and self.verdict != Verdict.flagged.value:
            meta["correctness_issue" if self.verdict in _ANSWER_VERDICTS else "runtime_error"] = self.message
        return kbf.eval_entry(sample=self.sample, compiled=self.compiled, correct=self.correct, timing=self.timing,
                              metadata=meta)


_ANSWER_VERDICTS = {Verdict.wrong_answer.value, Verdict.shape_mismatch.value, Verdict.dtype_mismatch.value,
                    Verdict.nondeterministic.value}


def _payload_timing(payload: dict[str, Any] | None, key: str) -> TimingStats | None:
    raw = ((payload or {}).get("observations") or {}).get(key)
    if raw is None:
        return None
    try:
        return TimingStats.model_validate(raw)
    except ValidationError:
        return None


def _compiled(res: Result) -> bool:
    """Whether the candidate built and constructed (KernelBench's `compiled`): not where it failed, hung or died
    in the static or compile phase (importing the submission, load_inline builds, constructing ModelNew)."""
    if res.verdict in NOT_COMPILED:
        return False
    obs = (res.payload or {}).get("observations") or {}
    early = (Phase.static.value, Phase.compile.value)
    if (obs.get("candidate_error") or {}).get("phase") in early:
        return False
    if res.verdict in (Verdict.timeout.value, Verdict.crashed.value):
        return (obs.get("candidate_exit") or {}).get("phase") not in early
    return True


class RunCounts(BaseModel):
    """Results of the run that are no KernelBench sample, and why."""

    not_kernelbench: int = 0  # a problem with no KernelBench id
    infra_errors: int = 0  # the harness's fault: left out as missing, never the model's
    unfinished: int = 0  # still queued or running
    older_version: int = 0  # graded against an older version of its problem


def run_samples(registry: Registry, rows: Iterable[tuple[Submission, Result | None]]
                ) -> tuple[list[RunSample], RunCounts]:
    counts = RunCounts()
    kept: dict[tuple[int, int, int], RunSample] = {}
    unnumbered: dict[tuple[int, int], int] = defaultdict(int)
    for sub, res in sorted(rows, key=lambda r: r[0].id):
        try:
            spec: ProblemSpec | None = registry.get(sub.problem_id)
        except UnknownProblem:
            spec = None
        place = kernelbench_place(spec)
        if place is None or spec is None:
            counts.not_kernelbench += 1
            continue
        if res is None:
            counts.unfinished += 1
            continue
        if res.verdict == Verdict.infra_error.value:
            counts.infra_errors += 1
            continue
        if res.problem_version != spec.version:
            counts.older_version += 1
            continue
        given = (sub.meta or {}).get("sample")
        if isinstance(given, int) and not isinstance(given, bool) and given >= 0:
            sample = given
        else:
            sample = unnumbered[place]
            unnumbered[place] += 1
        kept[(*place, sample)] = RunSample(
            level=place[0], problem=place[1], sample=sample, spec=spec, submission_id=sub.id, verdict=res.verdict,
            message=res.message, flags=list(res.flags or []), device=res.device, device_name=res.device_name,
            size=res.size, timing=_payload_timing(res.payload, "candidate_timing"), compiled=_compiled(res),
            speedup_vs_eager=res.speedup_vs_eager, speedup_vs_compile=res.speedup_vs_compile,
            precision=res.precision)
    return [kept[k] for k in sorted(kept)], counts


def pick_device(samples: Sequence[RunSample], requested: str | None) -> str:
    if requested:
        return requested
    present = {s.device for s in samples}
    return "cuda" if "cuda" in present else "cpu" if "cpu" in present else "none"


def on_device(samples: Sequence[RunSample], device: str) -> list[RunSample]:
    """The samples of one device class; one that never ran (no device: an invalid submission) fails in every one."""
    return [s for s in samples if s.device in (device, None)]


# ---- baselines ----------------------------------------------------------------------------------------------

@dataclass
class MeasuredBaseline:
    timing: TimingStats  # the measurement chosen: the one whose mean is the (lower) median of the vouched ones
    measurements: int
    device: str
    device_name: str | None


def measured_baselines(session: Session, specs: Sequence[ProblemSpec], *, device: str, device_name: str | None,
                       size: str, baseline: Baseline, precision: str = "fp32") -> dict[str, MeasuredBaseline]:
    """Per problem id, the reference's time on this device (name) and size from the measurements the harness
    vouches for (reporting.reference_vouched): the median one by its mean, the figure KernelBench's baselines
    give. Problems never measured so are left out."""
    by_id = {s.id: s for s in specs}
    key = "eager_timing" if baseline == "eager" else "compile_timing"
    found: dict[str, list[tuple[TimingStats, str | None]]] = defaultdict(list)
    for res in queries.reference_measurements(session, list(by_id), device):
        spec = by_id[res.problem_id]
        if res.problem_version != spec.version or res.size != size or res.precision != precision or (
                device_name and res.device_name != device_name):
            continue
        if not reference_vouched(res.verdict, res.flags or []):
            continue
        t = _payload_timing(res.payload, key)
        if t is not None:
            found[res.problem_id].append((t, res.device_name))
    out = {}
    for pid, timings in found.items():
        ordered = sorted(timings, key=lambda pair: pair[0].mean_ms)
        chosen, name = ordered[(len(ordered) - 1) // 2]
        out[pid] = MeasuredBaseline(chosen, len(ordered), device, name)
    return out


def baseline_json(measured: dict[str, MeasuredBaseline], specs: Sequence[ProblemSpec]) -> dict[str, Any]:
    """KernelBench's baseline-time file of these measurements: level -> problem file name -> statistics."""
    out: dict[str, dict[str, Any]] = {}
    for spec in sorted(specs, key=lambda s: kernelbench_place(s) or (0, 0)):
        place, m = kernelbench_place(spec), measured.get(spec.id)
        if place is None or m is None:
            continue
        out.setdefault(f"level{place[0]}", {})[f"{spec.name}.py"] = kbf.baseline_entry(
            m.timing, hardware=m.device_name or m.device, device=m.device, measurements=m.measurements)
    return out


def level_specs(registry: Registry) -> dict[int, list[ProblemSpec]]:
    out: dict[int, list[ProblemSpec]] = defaultdict(list)
    for spec in registry.all():
        place = kernelbench_place(spec)
        if place is not None:
            out[place[0]].append(spec)
    return out


def run_hardware(samples: Sequence[RunSample], device: str) -> tuple[str | None, str]:
    """The device name and size most of the run's results on this device class ran at."""
    mine = [s for s in samples if s.device == device]
    names = Counter(s.device_name for s in mine)
    sizes = Counter(s.size for s in mine)
    return (names.most_common(1)[0][0] if names else None,
            sizes.most_common(1)[0][0] if sizes else ("small" if device == "cpu" else "default"))


# ---- the report ---------------------------------------------------------------------------------------------

class KernelBenchReport(BaseModel):
    """KernelBench's metrics of a run, by KernelBench's definitions (harness/kernelbench_metrics.py)."""

    device: str  # the device class: results of other classes are not comparable and not counted
    device_name: str | None
    size: str
    baseline: Baseline
    baseline_source: str
    thresholds: list[float]
    levels: list[KernelBenchMetrics]
    left_out: RunCounts
    harness_fast_p: dict[str, float]  # our own view, named apart: see harness_fast_p_basis
    harness_fast_p_basis: str = ("the harness's fast_p: the best sample of each problem with a result (every "
                                 "level together), speedups against the reference timed in the same evaluation")
    definitions: str = ("KernelBench's (scripts/benchmark_eval_analysis.py): every problem of the level, sample 0 "
                        "of each, a missing or failed problem not correct; speedup = baseline mean / sample mean. "
                        "A time the harness does not vouch for counts as correct, never as faster.")


def kernelbench_report(session: Session, registry: Registry, samples: Sequence[RunSample], counts: RunCounts, *,
                       device: str | None = None, baseline: Baseline = "eager",
                       baseline_file: kbf.BaselineFile | None = None, baseline_label: str | None = None,
                       ks: Sequence[int] = (1,)) -> KernelBenchReport:
    """KernelBench's metrics for each level the run has results on. The baseline times come from
    `baseline_file` (KernelBench's format) where given, else from the harness's vouched measurements of the
    reference on the run's device and size."""
    dev = pick_device(samples, device)
    mine = on_device(samples, dev)
    name, size = run_hardware(samples, dev)
    specs = level_specs(registry)
    levels = sorted({s.level for s in mine})
    precisions = Counter(s.precision for s in mine)
    measured = {} if baseline_file is not None else measured_baselines(
        session, [sp for lv in levels for sp in specs.get(lv, [])], device=dev, device_name=name, size=size,
        baseline=baseline, precision=precisions.most_common(1)[0][0] if precisions else "fp32")
    out = []
    for lv in levels:
        numbers = {kernelbench_place(sp)[1]: sp for sp in specs.get(lv, [])}  # type: ignore[index]
        if baseline_file is not None:
            times = baseline_file.times(lv)
        else:
            times = {n: measured[sp.id].timing.mean_ms for n, sp in numbers.items() if sp.id in measured}
        source = baseline_label or (f"measured here ({baseline}, {name or dev}, {size} size)")
        out.append(level_metrics(lv, list(numbers), [s.kb() for s in mine if s.level == lv], times, baseline=source,
                                 ks=ks))
    return KernelBenchReport(
        device=dev, device_name=name, size=size, baseline=baseline,
        baseline_source=baseline_label or f"the harness's vouched measurements of the reference ({baseline})",
        thresholds=list(THRESHOLDS), levels=out, left_out=counts, harness_fast_p=harness_fast_p(samples, dev, baseline))


def eval_results_json(samples: Sequence[RunSample], device: str | None = None) -> dict[int, dict[str, Any]]:
    """Per level, KernelBench's eval-results file of the run's samples on one device class."""
    dev = pick_device(samples, device)
    out: dict[int, dict[str, Any]] = {}
    for lv in sorted({s.level for s in samples}):
        out[lv] = kbf.eval_results((s.problem, s.entry()) for s in on_device(samples, dev) if s.level == lv)
    return out


class NoRun(ValueError):
    """A run named by nothing: KernelBench's metrics over every model at once mean nothing."""


def run_rows(session: Session, *, model: str | None = None, submitter: str | None = None, tag: str | None = None,
             batch: str | None = None) -> list[tuple[Submission, Result | None]]:
    """The submissions of a run: an eval-dir batch, or those of a model, a submitter and/or a tag (eval-dir tags
    each submission with its run folder's name)."""
    if not (model or submitter or tag or batch):
        raise NoRun("name the run: a model, a tag (eval-dir tags results with the run folder's name), a submitter "
                    "or a batch")
    rows = queries.results_for_export(session, queries.SubmissionFilter(model=model, submitter=submitter), batch)
    return [(sub, res) for sub, res in rows if tag is None or tag in (sub.tags or [])]


def harness_fast_p(samples: Sequence[RunSample], device: str, baseline: Baseline = "eager") -> dict[str, float]:
    """Our own view beside KernelBench's (reporting.fast_p_curve): the best sample of each problem with a result,
    vouched speedups as the samples' own evaluations measured them against the reference."""
    scored = [Scored(submission_id=s.submission_id, problem_id=s.spec.id, submitter="", model="", verdict=s.verdict,
                     device=s.device, flags=s.flags, speedup_vs_eager=s.speedup_vs_eager,
                     speedup_vs_compile=s.speedup_vs_compile) for s in on_device(samples, device)]
    return fast_p_curve(best_per_problem(scored, baseline), baseline) or {}
