from __future__ import annotations

import logging
import re

import orjson
from quart import Quart, Response, request
from werkzeug.exceptions import HTTPException

from proxy.errors import StoreUnavailable

log = logging.getLogger("tollhouse")

# a NUL in a JSON body (raw, or an unescaped \u0000), or in any other body (raw, or %00)
_NUL_IN_JSON = re.compile(rb"\x00|(?<!\\)(?:\\\\)*\\u0000")
_NUL_IN_FORM = re.compile(rb"\x00|%00")


def nul_in_body(raw: bytes | str, mimetype: str) -> bool:
    """Whether a request body holds a NUL, raw or encoded as its media type encodes one."""
    pattern = _NUL_IN_JSON if mimetype.endswith("json") else _NUL_IN_FORM
    return pattern.search(raw if isinstance(raw, bytes) else raw.encode()) is not None


def _unavailable() -> tuple[type[Exception], ...]:
    """Either database's `unavailable` errors (see proxy.db.Database.unavailable)."""
    import sqlite3

    import psycopg

    return (sqlite3.OperationalError, psycopg.OperationalError)


def register(app: Quart) -> None:
    """The few routes that stay on Quart beside the MCP edge."""

    @app.route("/healthz")
    async def healthz() -> Response:
        return Response(b'{"status":"ok"}', 200, {"Content-Type": "application/json"})

    @app.before_request
    async def refuse_nul() -> Response | None:
        """No name, token or text Tollhouse stores or looks up may hold a NUL: PostgreSQL's
        text cannot, and a lookup of one would fail instead of finding nothing. Refused here,
        on every route Quart serves (not /mcp, whose payloads go to the upstream as they are),
        on both databases alike. The body is read once here and kept for the route."""
        if request.path.startswith("/api/v1"):
            return None  # the management API checks after authentication (proxy/api/routes.py)
        where = "path" if "\x00" in request.path else "query" if (
            b"%00" in request.query_string) else None
        if where is None and request.method in ("POST", "PUT", "PATCH"):
            if nul_in_body(await request.get_data(), request.mimetype):
                where = "body"
        if where is None:
            return None
        body = orjson.dumps({"error": "invalid_request",
                             "error_description": f"the request's {where} holds a NUL "
                                                  "character"})
        return Response(body, 400, {"Content-Type": "application/json"})

    @app.errorhandler(Exception)
    async def unexpected(exc: Exception) -> Response:
        # a bug: logged with its traceback here, never shown to the client
        if isinstance(exc, HTTPException):
            return await http_error(exc)
        if isinstance(exc, _unavailable()):  # locked past busy_timeout_s, or unreachable
            log.warning("database unavailable on %s: %s", request.path, exc)
            message = "the database is busy; retry"
            busy = (orjson.dumps({"detail": message}) if request.path.startswith("/api/v1")
                    else orjson.dumps({"error": "temporarily_unavailable",
                                       "error_description": message}))
            return Response(busy, 503, {"Content-Type": "application/json",
                                        "Retry-After": "1"})
        log.exception("unexpected failure", exc_info=exc)
        body = (b'{"detail":"internal error"}' if request.path.startswith("/api/v1")
                else b'{"error":"server_error","error_description":"internal error"}')
        return Response(body, 500, {"Content-Type": "application/json"})

    @app.errorhandler(StoreUnavailable)
    async def store_unavailable(exc: StoreUnavailable) -> Response:
        log.warning("live-state store unavailable on %s: %s", request.path, exc)
        detail = exc.detail or "the live-state store is unavailable; retry"
        body = (orjson.dumps({"detail": detail}) if request.path.startswith("/api/v1")
                else orjson.dumps({"error": exc.oauth_error, "error_description": detail}))
        return Response(body, exc.http_status, {"Content-Type": "application/json",
                                                **exc.headers})

    @app.errorhandler(HTTPException)
    async def http_error(exc: HTTPException) -> Response:
        # Framework-level refusals outside /mcp (unknown path, wrong method) in our JSON shape.
        status = exc.code or 500
        if request.path.startswith("/api/v1"):  # the management API's own shape (seed 004)
            body = orjson.dumps({"detail": (exc.name or "error").lower()})
        else:
            body = orjson.dumps({"error": (exc.name or "error").lower()})
        return Response(body, status, {"Content-Type": "application/json"})
