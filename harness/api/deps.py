"""Dependencies injected into routes: settings, a DB session, the problem registry, the caller's token."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, HTTPException, Request, status
from sqlalchemy.orm import Session

from harness.config import Settings
from harness.db import queries
from harness.db.models import Token
from harness.problems import Registry

_CREATE_HINT = "create one on the server with `harness tokens create --name <you>`"


def get_settings(request: Request) -> Settings:
    return request.app.state.settings


def get_session(request: Request) -> Iterator[Session]:
    with request.app.state.db.session() as session:
        yield session


def get_registry(request: Request) -> Registry:
    return request.app.state.registry


SettingsDep = Annotated[Settings, Depends(get_settings)]
SessionDep = Annotated[Session, Depends(get_session)]
RegistryDep = Annotated[Registry, Depends(get_registry)]


def _unauthorized(detail: str) -> HTTPException:
    return HTTPException(status.HTTP_401_UNAUTHORIZED, detail, headers={"WWW-Authenticate": "Bearer"})


def _bearer(request: Request) -> str | None:
    header = request.headers.get("authorization")
    if header is None:
        return None
    scheme, _, secret = header.partition(" ")
    if scheme.lower() != "bearer" or not secret.strip():
        raise _unauthorized("the Authorization header must be 'Bearer <token>'")
    return secret.strip()


def _lookup(session: Session, secret: str) -> Token:
    token = queries.find_token(session, secret)
    if token is None:
        raise _unauthorized("the token is not valid (unknown or revoked)")
    return token


def writer(request: Request, session: SessionDep, settings: SettingsDep) -> Token | None:
    """The caller's token; None for an anonymous caller in open mode. A token given is always checked."""
    secret = _bearer(request)
    if secret is None:
        if settings.open_mode:
            return None
        raise _unauthorized(f"this needs an API token: send 'Authorization: Bearer <token>'; {_CREATE_HINT}")
    return _lookup(session, secret)


def admin(request: Request, session: SessionDep) -> Token:
    """An admin token, open mode or not: re-evaluation and deletion act on everyone's submissions."""
    secret = _bearer(request)
    if secret is None:
        raise _unauthorized("this needs an admin token: send 'Authorization: Bearer <token>'; "
                            "create one on the server with `harness tokens create --name <you> --admin`")
    token = _lookup(session, secret)
    if not token.is_admin:
        raise HTTPException(status.HTTP_403_FORBIDDEN, "this needs an admin token; yours is not one")
    return token


WriterDep = Annotated[Token | None, Depends(writer)]
AdminDep = Annotated[Token, Depends(admin)]
