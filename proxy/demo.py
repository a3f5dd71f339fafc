"""A small MCP server (2025-11-25 Streamable HTTP) for `tollhouse demo`: no dependencies beyond
the gateway's own, so a fresh install has something to put behind the gateway.

Tools: `echo(text)`, `add(a, b)`, and `count(to)`, which streams a progress notification per
step over SSE when the client sent a progress token.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Awaitable, Callable
from typing import Any

import orjson

from proxy.errors import EndpointNotFound, jsonrpc_error_body, render

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

PROTOCOL_VERSION = "2025-11-25"
TOOLS = [
    {"name": "echo", "description": "Echo the text back.",
     "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}},
                     "required": ["text"]}},
    {"name": "add", "description": "Add two numbers.",
     "inputSchema": {"type": "object", "properties": {"a": {"type": "number"},
                                                      "b": {"type": "number"}},
                     "required": ["a", "b"]}},
    {"name": "count", "description": "Count to N, reporting progress at each step.",
     "inputSchema": {"type": "object", "properties": {"to": {"type": "integer", "minimum": 1,
                                                             "maximum": 100}},
                     "required": ["to"]}},
]


def demo_app() -> Callable[[Scope, Receive, Send], Awaitable[None]]:
    sessions: set[str] = set()

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        headers = {k.decode("latin1").lower(): v.decode("latin1") for k, v in scope["headers"]}
        if scope["path"] != "/mcp":
            return await _respond(send, 404, render(EndpointNotFound())[2])
        session = headers.get("mcp-session-id")
        if scope["method"] == "DELETE":
            sessions.discard(session or "")
            return await _respond(send, 200, b"")
        if scope["method"] != "POST":
            return await _respond(send, 405, b"", [(b"allow", b"POST, DELETE")])
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        try:
            msg = orjson.loads(body)
        except orjson.JSONDecodeError:
            return await _respond(send, 400, _error(None, -32700, "Parse error"))
        if not isinstance(msg, dict):
            return await _respond(send, 400, _error(None, -32600, "Invalid Request"))
        if "id" not in msg or "method" not in msg:
            return await _respond(send, 202, b"")
        if msg["method"] == "initialize":
            session = secrets.token_hex(16)
            sessions.add(session)
            result = {"protocolVersion": PROTOCOL_VERSION, "capabilities": {"tools": {}},
                      "serverInfo": {"name": "tollhouse-demo", "version": "1.0"}}
            return await _respond(send, 200, _result(msg["id"], result),
                                  [(b"mcp-session-id", session.encode())])
        if session is not None and session not in sessions:
            return await _respond(send, 404, _error(msg["id"], -32001, "Session not found"))
        await _dispatch(msg, send)

    return app


async def _dispatch(msg: dict[str, Any], send: Send) -> None:
    method, rid = msg["method"], msg["id"]
    params = msg.get("params") or {}
    if method == "ping":
        return await _respond(send, 200, _result(rid, {}))
    if method == "tools/list":
        return await _respond(send, 200, _result(rid, {"tools": TOOLS}))
    if method != "tools/call":
        return await _respond(send, 200, _error(rid, -32601, "Method not found"))
    name, args = params.get("name"), params.get("arguments") or {}
    try:
        if name == "echo":
            return await _respond(send, 200, _text(rid, str(args["text"])))
        if name == "add":
            return await _respond(send, 200, _text(rid, str(float(args["a"]) + float(args["b"]))))
        if name == "count":
            token = (params.get("_meta") or {}).get("progressToken")
            return await _count(send, rid, int(args["to"]), token)
    except (KeyError, TypeError, ValueError):
        return await _respond(send, 200, _error(rid, -32602, "Invalid params"))
    return await _respond(send, 200, _error(rid, -32602, f"Unknown tool: {name}"))


async def _count(send: Send, rid: Any, to: int, token: Any) -> None:
    to = max(1, min(to, 100))
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/event-stream"),
                            (b"cache-control", b"no-cache")]})
    for step in range(1, to + 1):
        if token is not None:
            note = {"jsonrpc": "2.0", "method": "notifications/progress",
                    "params": {"progressToken": token, "progress": step, "total": to}}
            await send({"type": "http.response.body", "more_body": True,
                        "body": b"event: message\ndata: " + orjson.dumps(note) + b"\n\n"})
        await asyncio.sleep(0.05)
    final = _text(rid, f"counted to {to}")
    await send({"type": "http.response.body", "body": b"event: message\ndata: " + final + b"\n\n"})


def _result(rid: Any, result: dict[str, Any]) -> bytes:
    return orjson.dumps({"jsonrpc": "2.0", "id": rid, "result": result})


def _text(rid: Any, text: str) -> bytes:
    return _result(rid, {"content": [{"type": "text", "text": text}], "isError": False})


def _error(rid: Any, code: int, message: str) -> bytes:
    return jsonrpc_error_body(code, message, rid)


async def _respond(send: Send, status: int, body: bytes,
                   extra: list[tuple[bytes, bytes]] | None = None) -> None:
    headers = [(b"content-type", b"application/json")] if body else []
    await send({"type": "http.response.start", "status": status,
                "headers": headers + (extra or [])})
    await send({"type": "http.response.body", "body": body})
