"""Error bodies: every 4xx says what to fix, as {"detail": "..."}; oversize and non-UTF-8 bodies are
refused before they are parsed."""

from __future__ import annotations

import json
import logging
import re
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import OperationalError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from harness.problems import Registry, UnknownProblem

log = logging.getLogger("harness.api")

_LOCATIONS = {"body", "query", "path", "header"}


def _field(loc: tuple[Any, ...]) -> str:
    parts = [str(p) for p in loc]
    where = parts[0] if parts and parts[0] in _LOCATIONS else None
    name = ".".join(parts[1:] if where else parts)
    if not name:
        return "the request body" if where == "body" else (where or "the request")
    return f"{name} ({where} parameter)" if where in ("query", "path", "header") else name


def _body_problem(error: dict[str, Any], body: Any, content_type: str | None) -> str | None:
    """What is wrong with the body as a whole (not one of its fields), or None.

    FastAPI reports a JSON syntax error at a character offset, and a body it did not parse because of its
    Content-Type as "not a valid dictionary"; neither says what to fix.
    """
    loc = tuple(error.get("loc", ()))
    if error.get("type") == "json_invalid" and isinstance(body, str) and len(loc) == 2 and isinstance(loc[1], int):
        at = json.JSONDecodeError(str((error.get("ctx") or {}).get("error", "invalid JSON")), body, loc[1])
        return f"not valid JSON ({at.msg} at line {at.lineno} column {at.colno})"
    if loc == ("body",) and isinstance(body, bytes | bytearray):  # left unparsed: not sent as JSON
        sent = f"Content-Type {content_type}" if content_type else "no Content-Type"
        return f"not sent as JSON ({sent}); send a JSON object with the header 'Content-Type: application/json'"
    return None


def _explain(errors: list[dict[str, Any]], body: Any = None, content_type: str | None = None) -> list[dict[str, Any]]:
    explained = []
    for e in errors:
        problem = _body_problem(e, body, content_type)
        field = "the request body" if problem else _field(tuple(e.get("loc", ())))
        message = problem or str(e.get("msg", "invalid")).removeprefix("Value error, ")
        explained.append({"field": field, "message": message, "type": e.get("type")})
    return explained


def validation_message(errors: list[dict[str, Any]]) -> str:
    return "; ".join(f"{e['field']}: {e['message']}" for e in _explain(errors))


async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    fields = _explain(list(exc.errors()), exc.body, request.headers.get("content-type"))
    return JSONResponse({"detail": "; ".join(f"{f['field']}: {f['message']}" for f in fields), "errors": fields},
                        status_code=422)


async def _db_busy(_request: Request, exc: OperationalError) -> JSONResponse:
    log.warning("database error: %s", exc)
    return JSONResponse({"detail": "the database is busy or unavailable; retry in a few seconds"}, status_code=503,
                        headers={"Retry-After": "5"})


class ProblemNotFound(Exception):
    def __init__(self, detail: str, suggestions: list[str]):
        self.detail = detail
        self.suggestions = suggestions


_KERNELBENCH_ID = re.compile(r"^level\d+/\d+$", re.IGNORECASE)


def unknown_problem_detail(e: UnknownProblem, registry: Registry) -> str:
    """What an unknown problem's 404 says. A KernelBench id this server lacks is most often a problem of a KernelBench
    folder the server was not started with: say which problems it serves, and how to serve such a folder."""
    if not _KERNELBENCH_ID.match(e.name.strip()):
        return str(e)
    served = sorted(s.kernelbench_id or s.id for s in registry.all())
    listed = ", ".join(served[:10]) + (", ..." if len(served) > 10 else "")
    return (f"{e}. This server serves {len(served)} problems ({listed}; GET /api/problems lists them). To evaluate "
            "the problems of a KernelBench folder, start the server with `harness serve --problems-dir "
            "<KernelBench>/KernelBench`")


async def _problem_not_found(_request: Request, exc: ProblemNotFound) -> JSONResponse:
    return JSONResponse({"detail": exc.detail, "suggestions": exc.suggestions}, status_code=404)


def install_handlers(app: FastAPI) -> None:
    app.add_exception_handler(RequestValidationError, _validation_error)  # type: ignore[arg-type]
    app.add_exception_handler(ProblemNotFound, _problem_not_found)  # type: ignore[arg-type]
    app.add_exception_handler(OperationalError, _db_busy)  # type: ignore[arg-type]


async def _send_error(send: Send, status: int, detail: str) -> None:
    body = json.dumps({"detail": detail}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})


class BodyGuard:
    """Refuses request bodies over `max_bytes` (413) and bodies that are not UTF-8 (400).

    The body is read here, counted as it arrives (a missing or false Content-Length does not get
    past), and replayed to the app.
    """

    def __init__(self, app: ASGIApp, max_bytes: int):
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in ("POST", "PUT", "PATCH"):
            await self.app(scope, receive, send)
            return
        too_big = (f"the request body is larger than the {self.max_bytes:,} bytes this server accepts "
                   "(HARNESS_MAX_BODY_BYTES)")
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            await _send_error(send, 413, too_big)
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await _send_error(send, 413, too_big)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        try:
            body.decode("utf-8")
        except UnicodeDecodeError as e:
            await _send_error(send, 400, f"the request body is not valid UTF-8 (byte {e.start}): send the "
                              "source as UTF-8 text inside JSON")
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)
