from __future__ import annotations

import orjson
from quart import Quart, Response
from werkzeug.exceptions import HTTPException


def register(app: Quart) -> None:
    """The few routes that stay on Quart beside the MCP edge."""

    @app.route("/healthz")
    async def healthz() -> Response:
        return Response(b'{"status":"ok"}', 200, {"Content-Type": "application/json"})

    @app.errorhandler(HTTPException)
    async def http_error(exc: HTTPException) -> Response:
        # Framework-level refusals outside /mcp (unknown path, wrong method) in our JSON shape.
        status = exc.code or 500
        body = orjson.dumps({"error": (exc.name or "error").lower()})
        return Response(body, status, {"Content-Type": "application/json"})
