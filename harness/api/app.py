"""The FastAPI app factory: settings in, app out; the database is opened (and migrated) here."""

from __future__ import annotations

import logging

from fastapi import FastAPI
from fastapi.responses import JSONResponse
from fastapi.staticfiles import StaticFiles
from starlette.requests import Request

from harness import __version__
from harness.api.admission import RequestSlots
from harness.api.errors import BodyGuard, install_handlers
from harness.api.routes import admin, health, kernelbench, leaderboard, pages, problems, submissions
from harness.config import Settings, get_settings
from harness.db.session import Database
from harness.problems import get_registry

log = logging.getLogger("harness.api")

DESCRIPTION = """Submit KernelBench-style `ModelNew` sources (or raw LLM replies) for a problem and poll their
verdicts. Write endpoints take `Authorization: Bearer <token>` (`harness tokens create`); re-evaluation and
deletion need an admin token."""


def create_app(settings: Settings | None = None, *, db: Database | None = None) -> FastAPI:
    settings = settings or get_settings()
    app = FastAPI(title="KernelHarness", version=__version__, description=DESCRIPTION)
    app.state.settings = settings
    app.state.db = db or Database(settings)
    app.state.registry = get_registry(settings.problems_dir)
    app.add_middleware(BodyGuard, max_bytes=settings.max_body_bytes)
    app.add_middleware(RequestSlots, slots=settings.db_pool_size + settings.db_pool_overflow)
    install_handlers(app)

    @app.exception_handler(Exception)
    async def _internal(_request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error", exc_info=exc)
        return JSONResponse({"detail": "internal error; the server log has the details"}, status_code=500)

    for module in (submissions, problems, leaderboard, kernelbench, admin, health, pages):
        app.include_router(module.router)
    pages.install_page_handlers(app)
    app.mount("/static", StaticFiles(directory=pages.STATIC_DIR), name="static")
    return app
