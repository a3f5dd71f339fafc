"""Fast upstream MCP stub for benchmarks.

A raw asyncio.Protocol HTTP/1.1 server (uvloop when installed) with
keep-alive and pipelining. ``POST /mcp`` takes a JSON-RPC message:

* a request (has ``id``) gets ``200`` + ``application/json``: a proper result
  for ``initialize``, ``server/discover`` (2026-07-28 and 2025-11-25 both),
  ``tools/list`` and ``ping``, the echo tool result for every other method;
  ``tools/call`` of ``big`` answers a 64 KiB text result, and of ``sse`` the
  echo result as one ``text/event-stream`` event (the paths of bench/paths.py);
* a notification or response (no ``id``) gets ``202`` with an empty body.

Usage: ``python bench/stub.py --port 9000``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
from collections.abc import Callable
from typing import Any, cast

try:
    import orjson

    _loads: Callable[[bytes], Any] = orjson.loads
    _dumps: Callable[[Any], bytes] = orjson.dumps
except ImportError:  # pragma: no cover - orjson is optional
    _loads = json.loads

    def _dumps(obj: Any) -> bytes:
        return json.dumps(obj, separators=(",", ":")).encode()


PROTOCOL_VERSION = "2025-11-25"
MAX_HEAD = 64 * 1024
MAX_BODY = 16 * 1024 * 1024

ECHO_RESULT: dict[str, Any] = {"content": [{"type": "text", "text": "echo"}], "isError": False}
SPECIAL_RESULTS: dict[str, dict[str, Any]] = {
    "initialize": {
        "protocolVersion": PROTOCOL_VERSION,
        "capabilities": {"tools": {}},
        "serverInfo": {"name": "tollhouse-bench-stub", "version": "0.1.0"},
    },
    "tools/list": {
        "tools": [
            {
                "name": "echo",
                "description": "Answers 'echo'.",
                "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}},
            }
        ]
    },
    "ping": {},
    "server/discover": {
        "supportedVersions": ["2026-07-28", PROTOCOL_VERSION],
        "capabilities": {"tools": {}},
        "serverInfo": {"name": "tollhouse-bench-stub", "version": "0.1.0"},
    },
}
BIG_RESULT: dict[str, Any] = {"content": [{"type": "text", "text": "x" * (64 * 1024)}], "isError": False}
_BIG_TAIL = b',"result":' + _dumps(BIG_RESULT) + b"}"
# Pre-encoded tail of the common echo answer: {"jsonrpc":"2.0","id":<id>,"result":...}
_ECHO_TAIL = b',"result":' + _dumps(ECHO_RESULT) + b"}"

REASONS = {200: b"OK", 202: b"Accepted", 400: b"Bad Request", 404: b"Not Found",
           405: b"Method Not Allowed", 411: b"Length Required", 413: b"Content Too Large",
           431: b"Request Header Fields Too Large"}


def _tool(message: dict[str, Any]) -> str | None:
    params = message.get("params")
    return params.get("name") if message["method"] == "tools/call" and isinstance(params, dict) else None


def answer(message: Any) -> bytes | None:
    """The JSON-RPC answer to one message, or None when it needs none."""
    if not isinstance(message, dict) or "id" not in message or "method" not in message:
        return None
    method = message["method"]
    id_json = _dumps(message["id"])
    if method in SPECIAL_RESULTS:
        return b'{"jsonrpc":"2.0","id":' + id_json + b',"result":' + _dumps(SPECIAL_RESULTS[method]) + b"}"
    if _tool(message) == "big":
        return b'{"jsonrpc":"2.0","id":' + id_json + _BIG_TAIL
    return b'{"jsonrpc":"2.0","id":' + id_json + _ECHO_TAIL


def handle_mcp(body: bytes) -> tuple[int, bytes, bytes]:
    """Status, content type and body for a POST /mcp body."""
    try:
        message = _loads(body)
    except ValueError:
        error = {"jsonrpc": "2.0", "id": None, "error": {"code": -32700, "message": "Parse error"}}
        return 400, JSON, _dumps(error)
    if isinstance(message, list):  # batch (pre-2025-06-18 clients)
        answers = [a for a in map(answer, message) if a is not None]
        return (200, JSON, b"[" + b",".join(answers) + b"]") if answers else (202, JSON, b"")
    reply = answer(message)
    if reply is None:
        return 202, JSON, b""
    if isinstance(message, dict) and _tool(message) == "sse":
        return 200, SSE, b"event: message\ndata: " + reply + b"\n\n"
    return 200, JSON, reply


JSON, SSE = b"application/json", b"text/event-stream"


def render(status: int, body: bytes, keep_alive: bool, content_type: bytes = JSON) -> bytes:
    head = b"HTTP/1.1 %d %s\r\n" % (status, REASONS.get(status, b"Unknown"))
    if body:
        head += b"Content-Type: " + content_type + b"\r\n"
    head += b"Content-Length: %d\r\n" % len(body)
    if not keep_alive:
        head += b"Connection: close\r\n"
    return head + b"\r\n" + body


def decode_chunked(buf: bytearray, start: int) -> tuple[bytes, int] | None:
    """Decode a chunked body from buf[start:]; (body, end offset) or None if incomplete."""
    body = bytearray()
    pos = start
    while True:
        eol = buf.find(b"\r\n", pos)
        if eol < 0:
            return None
        size = int(bytes(buf[pos:eol]).split(b";", 1)[0], 16)
        if size == 0:
            end = buf.find(b"\r\n\r\n", eol)  # skip trailers
            return (bytes(body), end + 4) if end >= 0 else None
        if len(buf) < eol + 2 + size + 2:
            return None
        body += buf[eol + 2 : eol + 2 + size]
        pos = eol + 2 + size + 2
        if len(body) > MAX_BODY:
            raise ValueError("body too large")


class StubProtocol(asyncio.Protocol):
    """One HTTP/1.1 connection; answers requests in order as they complete."""

    def __init__(self) -> None:
        self.buf = bytearray()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while self.transport is not None and self._handle_one():
            pass

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None

    def _fail(self, status: int) -> bool:
        assert self.transport is not None
        self.transport.write(render(status, b"", keep_alive=False))
        self.transport.close()
        self.transport = None
        return False

    def _handle_one(self) -> bool:
        """Handle one complete request from the buffer; False when none is complete."""
        assert self.transport is not None
        buf = self.buf
        head_end = buf.find(b"\r\n\r\n")
        if head_end < 0:
            return False if len(buf) <= MAX_HEAD else self._fail(431)
        lines = bytes(buf[:head_end]).split(b"\r\n")
        parts = lines[0].split(b" ")
        if len(parts) != 3:
            return self._fail(400)
        method, target, version = parts
        length, chunked, conn = -1, False, b""
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"transfer-encoding":
                chunked = b"chunked" in value.lower()
            elif name == b"connection":
                conn = value.strip().lower()
        body_start = head_end + 4
        if chunked:
            try:
                decoded = decode_chunked(buf, body_start)
            except ValueError:
                return self._fail(413)
            if decoded is None:
                return False
            body, end = decoded
        else:
            length = max(length, 0)
            if length > MAX_BODY:
                return self._fail(413)
            end = body_start + length
            if len(buf) < end:
                return False
            body = bytes(buf[body_start:end])
        del buf[:end]
        keep_alive = conn != b"close" if version == b"HTTP/1.1" else conn == b"keep-alive"
        path = target.split(b"?", 1)[0]
        kind = JSON
        if path != b"/mcp":
            status, payload = 404, b""
        elif method != b"POST":
            status, payload = 405, b""
        else:
            status, kind, payload = handle_mcp(body)
        self.transport.write(render(status, payload, keep_alive, kind))
        if not keep_alive:
            self.transport.close()
            self.transport = None
            return False
        return True


async def serve(host: str, port: int, ready: asyncio.Event | None = None) -> None:
    """Serve until SIGINT/SIGTERM (or cancellation)."""
    loop = asyncio.get_running_loop()
    server = await loop.create_server(StubProtocol, host, port, backlog=1024, reuse_address=True)
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (NotImplementedError, RuntimeError):  # not the main thread
            pass
    if ready is not None:
        ready.set()
    async with server:
        await stop.wait()


def run(host: str, port: int) -> None:
    try:
        import uvloop
    except ImportError:
        asyncio.run(serve(host, port))
    else:
        uvloop.run(serve(host, port))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    run(args.host, args.port)


if __name__ == "__main__":
    main()
