"""/api/leaderboard: best passing result per submitter+model, GPU and CPU results ranked apart."""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter

from harness import reporting
from harness.api.deps import RegistryDep, SessionDep
from harness.api.routes.submissions import find_problem
from harness.api.schemas import Board, ErrorBody, LeaderboardPublic
from harness.db import queries
from harness.problems import Registry, UnknownProblem
from harness.reporting import Scored
from harness.service.outcomes import scored
from harness.verdicts import Verdict


def current_version(registry: Registry, problem_id: str, version: int) -> bool:
    """Results for an older version of a problem are not comparable with today's."""
    try:
        return registry.get(problem_id).version == version
    except UnknownProblem:
        return True


router = APIRouter(prefix="/api", tags=["leaderboard"])


def _board(results: list[Scored], baseline: reporting.Baseline) -> Board:
    return Board(rows=reporting.leaderboard(results, baseline), fast_p=reporting.fast_p_table(results))


@router.get("/leaderboard", response_model=LeaderboardPublic, responses={404: {"model": ErrorBody}})
def leaderboard(session: SessionDep, registry: RegistryDep, problem: str | None = None,
                baseline: Literal["eager", "compile"] = "eager") -> LeaderboardPublic:
    """Rows rank each problem's best passing results by speedup over `baseline`; fast_p is the share of
    a submitter+model's problems solved correctly and more than p times faster (KernelBench's metric).
    Results without a device (nothing ran: invalid submissions) count as failures on both boards;
    infra errors (the harness's fault) count nowhere."""
    problem_ids = [find_problem(registry, problem).id] if problem else None
    gpu: list[Scored] = []
    cpu: list[Scored] = []
    for sub, res in queries.scored_results(session, problem_ids):
        if res.verdict == Verdict.infra_error.value or not current_version(registry, sub.problem_id,
                                                                            res.problem_version):
            continue
        s = scored(sub, res)
        if res.device in ("cuda", None):
            gpu.append(s)
        if res.device in ("cpu", None):
            cpu.append(s)
    return LeaderboardPublic(problem=problem_ids[0] if problem_ids else None, baseline=baseline,
                             thresholds=list(reporting.FAST_P_THRESHOLDS), gpu=_board(gpu, baseline),
                             cpu=_board(cpu, baseline))
