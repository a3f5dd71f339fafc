"""The one place an error becomes bytes: one renderer per shape, chosen by the surface the
request is on and the error's class. Framework-free: the MCP edge sends the triple itself, the
Quart routes through `proxy.web.routes.respond`."""

from __future__ import annotations

import datetime as dt
import secrets
from collections.abc import Callable, Mapping
from typing import Any

import orjson

from proxy.errors.base import GatewayError, Shape, Surface
from proxy.errors.http import Invalid
from proxy.errors.mcp import NO_ID, TOOL_ERROR_CODES, ToolResultDenial, UpstreamRejected

JSON = "application/json"
HEADERS: Mapping[Surface, Mapping[str, str]] = {
    "mcp": {"Content-Type": JSON},
    "api": {"Content-Type": JSON, "Cache-Control": "no-store"},
    "oauth": {"Content-Type": JSON, "Cache-Control": "no-store", "Pragma": "no-cache"},
}


def render(exc: GatewayError, request_id: Any = None, *, surface: Surface = "mcp"
           ) -> tuple[int, dict[str, str], bytes]:
    """Return (HTTP status, headers, body) for `exc` on `surface`; `request_id` is the
    JSON-RPC request's id on the MCP edge (null before parsing)."""
    body = RENDERERS[exc.shape_on(surface)](exc, request_id)
    return exc.wire_status, {**HEADERS[surface], **exc.headers}, body


def jsonrpc_error_body(code: int, message: str, request_id: Any = None,
                       data: dict[str, Any] | None = None, *, with_id: bool = True) -> bytes:
    error: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    return _jsonrpc_error(error, request_id if with_id else NO_ID)


def _jsonrpc_error(error: dict[str, Any], request_id: Any) -> bytes:
    if request_id is NO_ID:
        return orjson.dumps({"jsonrpc": "2.0", "error": error})
    return orjson.dumps({"jsonrpc": "2.0", "id": request_id, "error": error})


def _jsonrpc(exc: GatewayError, request_id: Any) -> bytes:
    if isinstance(exc, UpstreamRejected):  # the upstream's own error, relayed as it came
        return _jsonrpc_error(exc.error, request_id if exc.call else exc.upstream_id)
    return jsonrpc_error_body(exc.code, exc.wire_message, request_id, exc.data,
                              with_id=exc.with_id)


def _plain(exc: GatewayError, request_id: Any) -> bytes:
    return orjson.dumps({"error": exc.wire_message})


def _detail(exc: GatewayError, request_id: Any) -> bytes:
    return orjson.dumps({"detail": exc.description})


def _validation(exc: GatewayError, request_id: Any) -> bytes:
    assert isinstance(exc, Invalid)
    return orjson.dumps({"detail": exc.problems})


def _oauth(exc: GatewayError, request_id: Any) -> bytes:
    return orjson.dumps({"error": exc.oauth_error, "error_description": exc.description})


def _tool_result(exc: GatewayError, request_id: Any) -> bytes:
    assert isinstance(exc, ToolResultDenial)
    return orjson.dumps({"jsonrpc": "2.0", "id": request_id, "result": tool_error_result(exc)})


RENDERERS: Mapping[Shape, Callable[[GatewayError, Any], bytes]] = {
    "jsonrpc": _jsonrpc, "plain": _plain, "detail": _detail, "validation": _validation,
    "oauth": _oauth, "tool_result": _tool_result,
}


def tool_error_result(exc: ToolResultDenial) -> dict[str, Any]:
    structured: dict[str, Any] = {
        "error_id": f"err_{secrets.token_hex(10)}",
        "code": exc.tool_code,
        "message": exc.wire_message,
        "retryable": TOOL_ERROR_CODES.get(exc.tool_code, False),
        "trace_id": f"trc_{secrets.token_hex(10)}",
        "details": dict(exc.details),
        "created_at": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    if exc.retry_after_ms is not None:
        structured["retry_after_ms"] = exc.retry_after_ms
    result = {"content": [{"type": "text", "text": exc.wire_message}], "isError": True,
              "structuredContent": structured}
    if exc.result_type is not None:
        result["resultType"] = exc.result_type
    return result


def sse_event(body: bytes) -> bytes:
    """One SSE `message` event carrying a JSON-RPC message."""
    return b"event: message\ndata: " + body + b"\n\n"
