from __future__ import annotations

import logging

import orjson
from quart import Quart, Response, request
from werkzeug.exceptions import HTTPException

log = logging.getLogger("tollhouse")


def register(app: Quart) -> None:
    """The few routes that stay on Quart beside the MCP edge."""

    @app.route("/healthz")
    async def healthz() -> Response:
        return Response(b'{"status":"ok"}', 200, {"Content-Type": "application/json"})

    @app.errorhandler(Exception)
    async def unexpected(exc: Exception) -> Response:
        # a bug: logged with its traceback here, never shown to the client
        if isinstance(exc, HTTPException):
            return await http_error(exc)
        log.exception("unexpected failure", exc_info=exc)
        body = (b'{"detail":"internal error"}' if request.path.startswith("/api/v1")
                else b'{"error":"server_error","error_description":"internal error"}')
        return Response(body, 500, {"Content-Type": "application/json"})

    @app.errorhandler(HTTPException)
    async def http_error(exc: HTTPException) -> Response:
        # Framework-level refusals outside /mcp (unknown path, wrong method) in our JSON shape.
        status = exc.code or 500
        if request.path.startswith("/api/v1"):  # the management API's own shape (seed 004)
            body = orjson.dumps({"detail": (exc.name or "error").lower()})
        else:
            body = orjson.dumps({"error": (exc.name or "error").lower()})
        return Response(body, status, {"Content-Type": "application/json"})
