from __future__ import annotations

import asyncio
from collections.abc import Callable

import orjson
from quart import Quart, Response, request
from werkzeug.exceptions import HTTPException, RequestEntityTooLarge

from proxy.errors import (
    BodyTimeout,
    BodyTooLarge,
    GatewayError,
    MethodNotAllowed,
    render,
)
from proxy.gateway import EdgeRequest, EdgeResponse, Gateway

MCP_METHODS = ["GET", "POST", "DELETE", "PUT", "PATCH", "OPTIONS", "HEAD"]


def register(app: Quart, gateway: Callable[[], Gateway], body_timeout_s: float) -> None:
    async def read_body() -> bytes:
        try:
            async with asyncio.timeout(body_timeout_s):
                return await request.body  # type: ignore[no-any-return]
        except RequestEntityTooLarge:
            raise BodyTooLarge() from None
        except TimeoutError:
            raise BodyTimeout() from None

    @app.route("/mcp/<endpoint>", methods=MCP_METHODS)
    async def mcp(endpoint: str) -> Response:
        gw = gateway()
        try:
            route = gw.route(endpoint)
        except GatewayError as exc:
            return _plain(exc)
        # ASGI header names are lower case already: one pass builds the map every later
        # step reads (werkzeug's Headers.get scans the list on every lookup).
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in request.scope["headers"]}
        client = request.scope.get("client")
        req = EdgeRequest(headers, read_body, client[0] if client else None)
        method = request.method
        if method == "POST":
            result = await gw.post(route, req)
        elif method == "GET":
            result = await gw.get(route, req)
        elif method == "DELETE":
            result = await gw.delete(route, req)
        else:
            return _plain(MethodNotAllowed(headers={"Allow": "GET, POST, DELETE"}))
        return _to_quart(result)

    @app.route("/healthz")
    async def healthz() -> Response:
        return Response(b'{"status":"ok"}', 200, {"Content-Type": "application/json"})

    @app.errorhandler(HTTPException)
    async def http_error(exc: HTTPException) -> Response:
        # Framework-level refusals outside /mcp (unknown path, wrong method) in our JSON shape.
        status = exc.code or 500
        body = orjson.dumps({"error": (exc.name or "error").lower()})
        return Response(body, status, {"Content-Type": "application/json"})


def _plain(exc: GatewayError) -> Response:
    status, headers, body = render(exc)
    return Response(body, status, headers)


def _to_quart(result: EdgeResponse) -> Response:
    if result.stream is None:
        return Response(result.body, result.status, result.headers)
    response = Response(result.stream, result.status, result.headers)
    response.timeout = None  # a stream lasts as long as the call; the relay owns its timeouts
    return response
