"""Report: leaderboards and fast_p from stored results. Pure: no DB, no GPU.

fast_p here is our view of KernelBench's metric: the share of problems whose result is correct and more
than p times faster than the baseline (p = 0 is the share correct). A submitter+model's problems are
those it has a result for; on each, its best result counts. KernelBench's own definitions (over the whole
level, one sample per problem) are in harness/kernelbench_metrics.py.

The rule for every fast_p: a result counts as faster than p > 0 only where the harness vouches for its time
(`ranked`: passed, and no flag of verdicts.UNRANKED_CHECKS such as timing_unreliable); at p = 0 every
correct result counts, vouched for or not. A speedup that is not vouched for is shown with its flags, never
counted.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

from pydantic import BaseModel

from harness.precision import PRECISIONS
from harness.schema import Precision
from harness.verdicts import UNRANKED_CHECKS

FAST_P_THRESHOLDS: tuple[float, ...] = (0.0, 0.5, 0.8, 1.0, 1.5, 2.0)

Baseline = Literal["eager", "compile"]


def ranked(verdict: str | None, flags: Iterable[str]) -> bool:
    """Whether a result is ranked (the leaderboards, a problem page's ranks, the home page's best): passed, with no
    flag that keeps it off the boards (a pure-PyTorch forward, windows too noisy to vouch for its time, a tolerance
    that zeros would pass: verdicts.UNRANKED_CHECKS)."""
    return verdict == "passed" and UNRANKED_CHECKS.isdisjoint(flags)


def reference_vouched(verdict: str | None, flags: Iterable[str]) -> bool:
    """Whether a result's times of the reference (eager, torch.compile) are vouched for: it passed, and its windows
    were not too noisy (timing_unreliable covers the reference's windows too) nor timed on a GPU shared with other
    processes' work (shared_gpu). A flagged result's reference windows may have run beside a candidate that did not
    stay idle; a failed one's were not checked as a pair."""
    flags = list(flags)
    return verdict == "passed" and "timing_unreliable" not in flags and "shared_gpu" not in flags


@dataclass(slots=True, kw_only=True)
class Scored:
    """One submission's current result, as reports need it. A plain class, not a pydantic model: the boards build one
    per stored result (10,000 of them for the home page), from columns the database has already typed."""

    submission_id: int
    problem_id: str
    submitter: str
    model: str
    verdict: str
    device: str | None
    device_name: str | None = None
    size: str = "default"
    precision: Precision = "fp32"  # results of two precisions never rank together (`leaderboard`)
    speedup_vs_eager: float | None = None
    speedup_vs_compile: float | None = None
    candidate_ms: float | None = None
    created_at: datetime | None = None
    flags: list[str] = field(default_factory=list)  # the checks of its flags: some keep a passed result off the boards

    @property
    def correct(self) -> bool:
        return self.verdict == "passed"

    @property
    def rankable(self) -> bool:
        """Correct, and its time is vouched for: its speedup ranks and counts for fast_p at p > 0."""
        return ranked(self.verdict, self.flags)

    def speedup(self, baseline: Baseline) -> float | None:
        """The speedup as measured, vouched for or not: what a table shows beside the flags."""
        return self.speedup_vs_eager if baseline == "eager" else self.speedup_vs_compile

    def counted_speedup(self, baseline: Baseline) -> float | None:
        """The speedup that counts (ranks, and for fast_p at p > 0): None where its time is not vouched for."""
        return self.speedup(baseline) if self.rankable else None


class LeaderboardRow(BaseModel):
    rank: int
    problem_id: str
    submitter: str
    model: str
    submission_id: int
    speedup_vs_eager: float | None
    speedup_vs_compile: float | None
    candidate_ms: float | None
    device_name: str | None
    size: str
    precision: Precision = "fp32"
    created_at: datetime | None
    submissions: int  # this submitter+model's results on this problem and device class
    flags: list[str] = []  # those that do not keep it off the board (precision_below_fp32)


class FastPRow(BaseModel):
    submitter: str
    model: str
    problems: int
    correct: int
    fast_p_eager: dict[str, float]
    fast_p_compile: dict[str, float] | None  # None: no torch.compile baseline was timed


def p_key(p: float) -> str:
    return f"{p:g}"


def _rank_key(s: Scored, baseline: Baseline) -> tuple[bool, float, float]:
    sp = s.counted_speedup(baseline)
    at = s.created_at.timestamp() if s.created_at else 0.0
    return (sp is None, -(sp or 0.0), at)  # fastest first, untimed last, earlier wins a tie


def best(results: Iterable[Scored], baseline: Baseline = "eager") -> Scored | None:
    """The best result: correct before incorrect, then fastest by a speedup that counts (one not vouched for
    ranks as untimed)."""
    # min, not sorted()[0]: the same result (the first of equals), without sorting every group.
    return min(results, key=lambda s: (not s.correct, *_rank_key(s, baseline)), default=None)


def leaderboard(results: Sequence[Scored], baseline: Baseline = "eager") -> list[LeaderboardRow]:
    """Best passing result per problem, precision and submitter+model, ranked within each problem at each precision
    (an fp16 kernel's speedup is over the fp16 reference: it does not rank beside fp32 ones). A passed result flagged
    `no_custom_kernel` (or another of UNRANKED_CHECKS) counts for fast_p at p = 0 (it is correct) but is not ranked.

    Give it results of one device class: CPU and GPU speedups are not comparable.
    """
    groups: dict[tuple[str, str, str, str], list[Scored]] = defaultdict(list)
    for s in results:
        groups[(s.problem_id, s.precision, s.submitter, s.model)].append(s)
    per_problem: dict[tuple[str, str], list[tuple[Scored, int]]] = defaultdict(list)
    for (problem, prec, _, _), group in groups.items():
        top = best([s for s in group if s.rankable], baseline)
        if top is not None:
            per_problem[(problem, prec)].append((top, len(group)))
    rows: list[LeaderboardRow] = []
    for problem, prec in sorted(per_problem, key=lambda key: (key[0], PRECISIONS.index(key[1]))):
        ranked = sorted(per_problem[(problem, prec)], key=lambda pair: _rank_key(pair[0], baseline))
        for rank, (s, n) in enumerate(ranked, 1):
            rows.append(LeaderboardRow(
                rank=rank, problem_id=problem, submitter=s.submitter, model=s.model, submission_id=s.submission_id,
                speedup_vs_eager=s.speedup_vs_eager, speedup_vs_compile=s.speedup_vs_compile,
                candidate_ms=s.candidate_ms, device_name=s.device_name, size=s.size, precision=s.precision,
                created_at=s.created_at, submissions=n, flags=s.flags))
    return rows


def fast_p(per_problem: Sequence[Scored], p: float, baseline: Baseline = "eager") -> float:
    """Share of the given results (one per problem) that are correct and faster than p times the baseline, by a
    speedup the harness vouches for (at p = 0, every correct result)."""
    if not per_problem:
        return 0.0
    hits = 0
    for s in per_problem:
        sp = s.counted_speedup(baseline)
        if s.correct and (p == 0 or (sp is not None and sp > p)):
            hits += 1
    return hits / len(per_problem)


def fast_p_curve(per_problem: Sequence[Scored], baseline: Baseline = "eager",
                 thresholds: Sequence[float] = FAST_P_THRESHOLDS) -> dict[str, float] | None:
    if baseline == "compile" and not any(s.speedup_vs_compile is not None for s in per_problem):  # as measured
        return None
    return {p_key(p): fast_p(per_problem, p, baseline) for p in thresholds}


def best_per_problem(results: Iterable[Scored], baseline: Baseline = "eager") -> list[Scored]:
    by_problem: dict[str, list[Scored]] = defaultdict(list)
    for s in results:
        by_problem[s.problem_id].append(s)
    return [b for problem in sorted(by_problem) if (b := best(by_problem[problem], baseline)) is not None]


def fast_p_table(results: Sequence[Scored], thresholds: Sequence[float] = FAST_P_THRESHOLDS) -> list[FastPRow]:
    """fast_p per submitter+model over the problems each has results for (one device class)."""
    by_pair: dict[tuple[str, str], list[Scored]] = defaultdict(list)
    for s in results:
        by_pair[(s.submitter, s.model)].append(s)
    rows = []
    for (submitter, model), group in sorted(by_pair.items()):
        # The best per problem may differ by baseline: the fastest vs eager need not be fastest vs compile.
        eager = best_per_problem(group, "eager")
        compiled = best_per_problem(group, "compile")
        rows.append(FastPRow(
            submitter=submitter, model=model, problems=len(eager), correct=sum(s.correct for s in eager),
            fast_p_eager=fast_p_curve(eager, "eager", thresholds) or {},
            fast_p_compile=fast_p_curve(compiled, "compile", thresholds)))
    rows.sort(key=lambda r: (-r.fast_p_eager.get("1", 0.0), -r.correct, r.submitter, r.model))
    return rows
