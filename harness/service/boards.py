"""Which stored results count on the leaderboards, and on which one: the rule /api/leaderboard and the
pages share.

A result belongs to the board of the device it ran on: GPU results and CPU results (at the problems' small
sizes) are not comparable. Each board is read at one precision (fp32 unless asked): a speedup at fp16 is over the
fp16 reference, and its tolerance is another. A result that never ran (an invalid submission: no device) belongs to no
board, and neither does a submission still waiting for its result. The harness's own failures
(infra_error) count nowhere, nor results for an older version of a problem.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence

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


def board_of(registry: Registry, problem_id: str, problem_version: int, verdict: str, device: str | None
             ) -> str | None:
    """The board a result counts on, or None."""
    if verdict == Verdict.infra_error.value or not current_version(registry, problem_id, problem_version):
        return None
    return device if device in BOARDS else None


def board_results(session: Session, registry: Registry, problem_ids: Sequence[str] | None = None,
                  precision: str = DEFAULT_PRECISION) -> dict[str, list[Scored]]:
    """Every board's results at `precision` (current results only), each board in BOARDS present, possibly empty."""
    return boards_by_precision(session, registry, problem_ids)[precision]


def boards_by_precision(session: Session, registry: Registry, problem_ids: Sequence[str] | None = None
                        ) -> dict[str, dict[str, list[Scored]]]:
    """Per precision (each in PRECISIONS), every board's results, as `board_results` gives one precision's."""
    out: dict[str, dict[str, list[Scored]]] = {p: {board: [] for board in BOARDS} for p in PRECISIONS}
    # Per row, only what differs from row to row: 10,000 results share a few dozen boards' keys and flag lists.
    # Unpacked, not read by name: a Row's attributes cost 35 ms of 10,000 rows.
    board = functools.cache(functools.partial(board_of, registry))
    flag_list = functools.cache(lambda text: tuple(json.loads(text) or ()) if text else ())
    for (submission_id, problem_id, submitter, model, problem_version, verdict, device, device_name, size, precision,
         speedup_vs_eager, speedup_vs_compile, candidate_ms, created_at, flags) in queries.scored_results(
            session, problem_ids):
        where = board(problem_id, problem_version, verdict, device)
        if where is not None and precision in out:
            out[precision][where].append(Scored(
                submission_id=submission_id, problem_id=problem_id, submitter=submitter, model=model, verdict=verdict,
                device=device, device_name=device_name, size=size, precision=precision,
                speedup_vs_eager=speedup_vs_eager, speedup_vs_compile=speedup_vs_compile, candidate_ms=candidate_ms,
                created_at=created_at, flags=list(flag_list(flags))))
    return out
