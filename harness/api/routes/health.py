"""/healthz: the database answers; the queue and the workers seen lately; degraded while queued jobs wait for
a worker that none of the live ones can be (a CUDA job and CPU workers only, or no worker at all)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from sqlalchemy import text
from sqlalchemy.exc import SQLAlchemyError

from harness import __version__
from harness.api.deps import SessionDep, SettingsDep
from harness.api.schemas import Health, Unmet, WorkerPublic
from harness.db import queries
from harness.requirements import waiting_note

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=Health, responses={503: {"model": Health}})
def healthz(session: SessionDep, settings: SettingsDep):
    try:
        session.execute(text("SELECT 1"))
        counts = queries.job_counts(session)
        workers = [WorkerPublic(id=w.id, hostname=w.hostname, slots=w.slots, last_seen=w.last_seen)
                   for w in queries.live_workers(session, within_s=settings.worker_silent_after_s)]
        waiting = [Unmet(needs=u.needs, message=waiting_note(u.needs), jobs=u.jobs, submission_ids=u.submission_ids)
                   for u in queries.unmet_needs(session, within_s=settings.worker_silent_after_s)]
    except SQLAlchemyError as e:
        body = Health(status="unavailable", version=__version__, database=f"error: {type(e).__name__}",
                      open_mode=settings.open_mode, queue={}, workers=[])
        return JSONResponse(body.model_dump(mode="json"), status_code=503)
    counts.pop("done", None)
    return Health(status="degraded" if waiting else "ok", version=__version__, database="ok",
                  open_mode=settings.open_mode, queue=counts, workers=workers, waiting=waiting)
