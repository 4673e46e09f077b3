"""The HTML pages: /, /problems/{id}, /submissions/{id}. Server-rendered, usable without JavaScript.

Sorting and filtering are query parameters (`?sort=speedup_eager&order=desc&model=...`), so every view
is a link. Jinja autoescapes everything; the only markup that is not escaped here is SVG and highlighted
source made by code that escapes its text itself (`charts`, `submission_page.highlighted`).
"""

from __future__ import annotations

import re
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

import jinja2
from fastapi import APIRouter, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.responses import HTMLResponse, PlainTextResponse, Response
from fastapi.templating import Jinja2Templates
from markupsafe import Markup, escape
from starlette.exceptions import HTTPException as StarletteHTTPException

from harness import __version__
from harness.api import pages, submission_page
from harness.api.deps import RegistryDep, SessionDep, SettingsDep
from harness.api.errors import unknown_problem_detail
from harness.db import queries
from harness.problems import UnknownProblem
from harness.schema import Tolerance

HERE = Path(__file__).resolve().parents[1]
STATIC_DIR = HERE / "static"

router = APIRouter(include_in_schema=False)


class PageNotFound(Exception):
    def __init__(self, title: str, detail: str, suggestions: list[tuple[str, str]] | None = None):
        self.title, self.detail, self.suggestions = title, detail, suggestions or []


def _speedup(v: float | None) -> str:
    return "—" if v is None else f"{v:.3f}×" if v < 10 else f"{v:.1f}×"


def _ms(v: float | None) -> str:
    return "—" if v is None else f"{v:.3f} ms" if v < 100 else f"{v:.0f} ms"


def _sci(v: float | None) -> str:
    return "—" if v is None else "0" if v == 0 else f"{v:.2e}".replace("e-0", "e-").replace("e+0", "e+")


def _pct(v: float | None) -> str:
    return "—" if v is None else f"{v:.0%}"


def _when(v: datetime | None) -> str:
    return "—" if v is None else v.strftime("%Y-%m-%d %H:%M UTC")


def _breakable(text: Any) -> Markup:
    """Escaped text that may wrap after `_`, `.`, `/` and `=`: identifiers such as 94_Gemm_BiasAdd_Hardtanh
    or cuda.matmul.allow_tf32 have no spaces, and a narrow screen would otherwise break them mid-word."""
    return Markup(re.sub(r"([_./=])", r"\1<wbr>", str(escape(str(text)))))  # noqa: S704 - escaped first


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(HERE / "templates"), autoescape=True,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters.update(speedup=_speedup, ms=_ms, sci=_sci, pct=_pct, when=_when, breakable=_breakable)
    env.globals.update(version=__version__, verdict_colours=pages.VERDICT_COLOURS)
    return env


templates = Jinja2Templates(env=_environment())


def query_url(request: Request, **changes: Any) -> str:
    """This page's URL with some query parameters changed (None removes one)."""
    params = {k: v for k, v in request.query_params.items() if k not in changes}
    params.update({k: str(v) for k, v in changes.items() if v is not None})
    url = request.url.replace_query_params(**params)
    return url.path + (f"?{url.query}" if url.query else "")


def _sorting(sort: str | None, order: str | None, keys: dict[str, Any], default: str) -> tuple[str, bool]:
    key = sort if sort in keys else default
    descending = order == "desc" if order in ("asc", "desc") else key in pages.DEFAULT_DESCENDING
    return key, descending


def _render(request: Request, name: str, status_code: int = 200, **context: Any) -> HTMLResponse:
    context.update(request=request, query_url=lambda **c: query_url(request, **c))
    return templates.TemplateResponse(request, name, context, status_code=status_code)


@router.get("/", response_class=HTMLResponse)
def home(request: Request, session: SessionDep, registry: RegistryDep, device: str | None = None,
         baseline: Literal["eager", "compile"] = "eager", by: str = "model", sort: str | None = None,
         order: str | None = None, precision: str | None = None) -> HTMLResponse:
    key, desc = _sorting(sort, order, pages.HOME_SORTS, "problem")
    page = pages.home_page(session, registry, device=device, baseline=baseline,
                           by=by if by in pages.GROUPINGS else "model", sort=key, descending=desc,
                           precision=precision)
    return _render(request, "index.html", page=page, sort=key, desc=desc)


@router.get("/problems/{problem:path}", response_class=HTMLResponse)
def problem(problem: str, request: Request, session: SessionDep, registry: RegistryDep, device: str | None = None,
            model: str | None = None, verdict: str | None = None, sort: str | None = None,
            order: str | None = None, precision: str | None = None) -> HTMLResponse:
    try:
        spec = registry.get(problem)
    except UnknownProblem as e:
        # A suggestion reads "<id> (<kernelbench id>)": the id is its first word.
        links = [(s, f"/problems/{s.split(' ', 1)[0]}") for s in e.suggestions]
        raise PageNotFound("Unknown problem", unknown_problem_detail(e, registry), links) from None
    key, desc = _sorting(sort, order, pages.PROBLEM_SORTS, "rank")
    # Passing results by default: the leaderboard; "all" shows every verdict.
    wanted = None if verdict == "all" else verdict or "passed"
    page = pages.problem_page(session, registry, spec, device=device, model=model or None, verdict=wanted,
                              sort=key, descending=desc, precision=precision)
    return _render(request, "problem.html", page=page, sort=key, desc=desc, verdict_param=verdict or "passed")


@router.get("/submissions/{submission_id}", response_class=HTMLResponse)
def submission(submission_id: str, request: Request, session: SessionDep, settings: SettingsDep,
               registry: RegistryDep) -> HTMLResponse:
    sub = queries.get_submission(session, int(submission_id)) if submission_id.isdigit() else None
    if sub is None:
        raise PageNotFound("Unknown submission", f"There is no submission {submission_id!r}.")
    try:
        tolerance: Tolerance | None = registry.get(sub.problem_id).tolerance_at(sub.precision)
    except UnknownProblem:
        tolerance = None
    page = submission_page.submission_page(session, sub, settings, tolerance)
    return _render(request, "submission.html", page=page)


@router.get("/favicon.ico")
@router.get("/favicon.svg")
def favicon() -> Response:
    """The tab icon, from this server (the pages load nothing from elsewhere). Browsers ask for /favicon.ico
    whatever the page names, and take an SVG served there by its media type."""
    return Response((STATIC_DIR / "favicon.svg").read_bytes(), media_type="image/svg+xml",
                    headers={"Cache-Control": "public, max-age=86400"})


@router.get("/highlight.css")
def highlight_css() -> Response:
    return PlainTextResponse(submission_page.highlight_css(), media_type="text/css",
                             headers={"Cache-Control": "public, max-age=3600"})


def _wants_html(request: Request) -> bool:
    return not request.url.path.startswith("/api") and "text/html" in request.headers.get("accept", "")


def install_page_handlers(app: Any) -> None:
    """Unknown ids and paths get an HTML 404 page in a browser; API clients keep their JSON."""

    async def page_not_found(request: Request, exc: PageNotFound) -> HTMLResponse:
        return _render(request, "404.html", status_code=404, title=exc.title, detail=exc.detail,
                       suggestions=exc.suggestions)

    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        if exc.status_code == 404 and _wants_html(request):
            return _render(request, "404.html", status_code=404, title="Page not found",
                           detail=f"Nothing lives at {request.url.path}.", suggestions=[])
        return await http_exception_handler(request, exc)

    app.add_exception_handler(PageNotFound, page_not_found)
    app.add_exception_handler(StarletteHTTPException, http_error)
