"""/api/leaderboard: best passing result per submitter+model, GPU and CPU results ranked apart, one precision at a
time."""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter

from harness import reporting
from harness.api.deps import RegistryDep, SessionDep
from harness.api.routes.submissions import find_problem
from harness.api.schemas import Board, ErrorBody, LeaderboardPublic
from harness.reporting import Scored
from harness.schema import Precision
from harness.service.boards import board_results

router = APIRouter(prefix="/api", tags=["leaderboard"])


def _board(results: list[Scored], baseline: reporting.Baseline) -> Board:
    return Board(rows=reporting.leaderboard(results, baseline), fast_p=reporting.fast_p_table(results))


@router.get("/leaderboard", response_model=LeaderboardPublic, responses={404: {"model": ErrorBody}})
def leaderboard(session: SessionDep, registry: RegistryDep, problem: str | None = None,
                baseline: Literal["eager", "compile"] = "eager", precision: Precision = "fp32") -> LeaderboardPublic:
    """Rows rank each problem's best passing results by speedup over `baseline`; fast_p is the share of
    a submitter+model's problems solved correctly and, for p > 0, more than p times faster by a time the harness
    vouches for (our view of KernelBench's metric; /api/kernelbench gives KernelBench's definitions).
    A result counts on the board of the device it ran on; one that never ran (an invalid submission)
    counts on neither, and infra errors (the harness's fault) count nowhere. Only results at `precision` count."""
    problem_ids = [find_problem(registry, problem).id] if problem else None
    boards = board_results(session, registry, problem_ids, precision)
    return LeaderboardPublic(problem=problem_ids[0] if problem_ids else None, baseline=baseline, precision=precision,
                             thresholds=list(reporting.FAST_P_THRESHOLDS), gpu=_board(boards["cuda"], baseline),
                             cpu=_board(boards["cpu"], baseline))
