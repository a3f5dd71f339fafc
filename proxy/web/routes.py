"""The few routes that stay on Quart beside the MCP edge, and the one error boundary of every
route Quart serves: each error is rendered by `proxy.errors.render` for the request's surface
(`surface_of`), and a foreign exception is mapped to one of ours first."""

from __future__ import annotations

import logging
import re

from quart import Quart, Response, request
from werkzeug.exceptions import HTTPException

from proxy.errors import (
    DatabaseUnavailable,
    GatewayError,
    HTTPRefusal,
    InternalError,
    NulCharacter,
    StoreUnavailable,
    Surface,
    render,
    surface_of,
)
from proxy.storage import db

log = logging.getLogger("tollhouse")

# a NUL in a JSON body (raw, or an unescaped \u0000), or in any other body (raw, or %00)
_NUL_IN_JSON = re.compile(rb"\x00|(?<!\\)(?:\\\\)*\\u0000")
_NUL_IN_FORM = re.compile(rb"\x00|%00")


def nul_in_body(raw: bytes | str, mimetype: str) -> bool:
    """Whether a request body holds a NUL, raw or encoded as its media type encodes one."""
    pattern = _NUL_IN_JSON if mimetype.endswith("json") else _NUL_IN_FORM
    return pattern.search(raw if isinstance(raw, bytes) else raw.encode()) is not None


def respond(exc: GatewayError, surface: Surface | None = None) -> Response:
    """`exc` as a Quart response, in the shape of the request's surface."""
    status, headers, body = render(exc, surface=surface or surface_of(request.path))
    return Response(body, status, headers)


def register(app: Quart) -> None:
    app.add_url_rule("/healthz", "healthz", healthz)
    app.before_request(refuse_nul)
    app.register_error_handler(GatewayError, answer)
    app.register_error_handler(HTTPException, refused)
    app.register_error_handler(Exception, unexpected)


async def healthz() -> Response:
    return Response(b'{"status":"ok"}', 200, {"Content-Type": "application/json"})


async def refuse_nul() -> None:
    """No name, token or text Tollhouse stores or looks up may hold a NUL: PostgreSQL's
    text cannot, and a lookup of one would fail instead of finding nothing. Refused here,
    on every route Quart serves (not /mcp, whose payloads go to the upstream as they are),
    on both databases alike. The body is read once here and kept for the route."""
    if surface_of(request.path) == "api":
        return  # the management API checks after authentication (proxy/api/endpoint.py)
    where = "path" if "\x00" in request.path else "query" if (
        b"%00" in request.query_string) else None
    if where is None and request.method in ("POST", "PUT", "PATCH") \
            and nul_in_body(await request.get_data(), request.mimetype):
        where = "body"
    if where is not None:
        raise NulCharacter(where)


async def answer(exc: GatewayError) -> Response:
    if isinstance(exc, StoreUnavailable):
        what = "database" if isinstance(exc, DatabaseUnavailable) else "live-state store"
        log.warning("%s unavailable on %s: %s", what, request.path, exc.__cause__ or exc)
    return respond(exc)


async def refused(exc: HTTPException) -> Response:
    """The framework's own refusals (unknown path, wrong method) in our shapes."""
    return respond(HTTPRefusal(exc.code or 500, exc.name or "error"))


async def unexpected(exc: Exception) -> Response:
    if isinstance(exc, HTTPException):
        return await refused(exc)
    if db.is_unavailable(exc):  # locked past busy_timeout_s, or unreachable
        log.warning("database unavailable on %s: %s", request.path, exc)
        return respond(DatabaseUnavailable())
    # a bug: logged with its traceback here, never shown to the client
    log.exception("unexpected failure", exc_info=exc)
    return respond(InternalError())
