"""Which stored results count on the leaderboards, and on which one: the rule /api/leaderboard and the
pages share.

A result belongs to the board of the device it ran on: GPU results and CPU results (at the problems' small
sizes) are not comparable. Each board is read at one precision (fp32 unless asked): a speedup at fp16 is over the
fp16 reference, and its tolerance is another. A result that never ran (an invalid submission: no device) belongs to no
board, and neither does a submission still waiting for its result. The harness's own failures
(infra_error) count nowhere, nor results for an older version of a problem.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Row
from sqlalchemy.orm import Session

from harness.db import queries
from harness.precision import DEFAULT_PRECISION, PRECISIONS
from harness.problems import Registry, UnknownProblem
from harness.reporting import Scored
from harness.verdicts import Verdict

BOARDS = ("cuda", "cpu")


def current_version(registry: Registry, problem_id: str, version: int) -> bool:
    """Results for an older version of a problem are not comparable with today's."""
    try:
        return registry.get(problem_id).version == version
    except UnknownProblem:
        return True


def board_of(registry: Registry, row: Row[Any]) -> str | None:
    """The board a row of `queries.scored_results` counts on, or None."""
    if row.verdict == Verdict.infra_error.value or not current_version(registry, row.problem_id,
                                                                        row.problem_version):
        return None
    return row.device if row.device in BOARDS else None


def board_results(session: Session, registry: Registry, problem_ids: Sequence[str] | None = None,
                  precision: str = DEFAULT_PRECISION) -> dict[str, list[Scored]]:
    """Every board's results at `precision` (current results only), each board in BOARDS present, possibly empty."""
    return boards_by_precision(session, registry, problem_ids)[precision]


def boards_by_precision(session: Session, registry: Registry, problem_ids: Sequence[str] | None = None
                        ) -> dict[str, dict[str, list[Scored]]]:
    """Per precision (each in PRECISIONS), every board's results, as `board_results` gives one precision's."""
    out: dict[str, dict[str, list[Scored]]] = {p: {board: [] for board in BOARDS} for p in PRECISIONS}
    for row in queries.scored_results(session, problem_ids):
        board = board_of(registry, row)
        if board is not None and row.precision in out:
            fields = row._asdict()
            del fields["problem_version"]
            fields["flags"] = list(fields["flags"] or [])
            # Constructed, not validated: every field is a column the database holds as Scored types it, and
            # validating 10,000 of them would cost a leaderboard a tenth of a second.
            out[row.precision][board].append(Scored.model_construct(**fields))
    return out
