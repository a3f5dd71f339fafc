"""A legacy (2025-11-25) upstream that holds a `tools/call` open until it is cancelled, and
timestamps what it is told: for bench/cancel_latency.py.

Raw ASGI under Hypercorn, no framework. `POST /mcp`:
- `initialize` answers a result and an upstream `Mcp-Session-Id`;
- `tools/call` of tool `hold` with `arguments.token` is held: its arrival is timestamped, and it
  stays open until a `notifications/cancelled` names its request id (then it answers a result,
  which the gateway has no one to give to) or the gateway drops the request (timestamped as
  `closed_t`), or 60 s pass;
- `notifications/cancelled` is timestamped on arrival (`notice_t`), before anything else is
  done with it, and answered 202; any other notification 202; any other request the echo result.

`GET /trial/<token>?wait=held|notice|closed&timeout_s=5` waits (up to the timeout) until that
moment of the trial has happened and answers `{"held_t", "notice_t", "closed_t"}` (each a
`time.monotonic()` reading, or null): CLOCK_MONOTONIC is one clock for every process on the
machine, so the client compares them with its own readings.

Usage: `python bench/hold_upstream.py --port N`
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import secrets
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

HOLD_S = 60.0
MAX_WAIT_S = 30.0
ECHO = {"content": [{"type": "text", "text": "echo"}], "isError": False}


@dataclass
class Trial:
    held_t: float | None = None
    notice_t: float | None = None
    closed_t: float | None = None
    events: dict[str, asyncio.Event] = field(
        default_factory=lambda: {k: asyncio.Event() for k in ("held", "notice", "closed")})

    def mark(self, what: str, t: float) -> None:
        setattr(self, f"{what}_t", t)
        self.events[what].set()

    def as_json(self) -> bytes:
        return json.dumps({"held_t": self.held_t, "notice_t": self.notice_t,
                           "closed_t": self.closed_t}).encode()


class HoldUpstream:
    def __init__(self) -> None:
        self.trials: dict[str, Trial] = {}
        self.by_request: dict[str, str] = {}  # the request id as the upstream saw it -> token
        self.session = f"up-{secrets.token_hex(8)}"

    def trial(self, token: str) -> Trial:
        if len(self.trials) > 10_000:  # a long run: forget the oldest
            self.trials.pop(next(iter(self.trials)))
        return self.trials.setdefault(token, Trial())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        if scope["type"] != "http":
            return
        path, method = scope["path"], scope["method"]
        if method == "GET" and path.startswith("/trial/"):
            await self._trial(path.removeprefix("/trial/"), scope, send)
        elif method == "POST" and path == "/mcp":
            await self._mcp(receive, send)
        else:
            await _answer(send, 404, b"")

    async def _trial(self, token: str, scope: Scope, send: Send) -> None:
        query = parse_qs(scope.get("query_string", b"").decode())
        trial = self.trial(token)
        what = query.get("wait", ["held"])[0]
        if what not in trial.events:
            await _answer(send, 400, b'{"error": "wait: held, notice or closed"}')
            return
        timeout_s = min(float(query.get("timeout_s", ["5"])[0]), MAX_WAIT_S)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(trial.events[what].wait(), timeout_s)
        await _answer(send, 200, trial.as_json())

    async def _mcp(self, receive: Receive, send: Send) -> None:
        body = b""
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        arrived = time.monotonic()
        try:
            msg = json.loads(body)
        except ValueError:
            await _answer(send, 400, b"")
            return
        method = msg.get("method")
        if "id" not in msg:  # a notification
            if method == "notifications/cancelled":
                token = self.by_request.get(json.dumps((msg.get("params") or {}).get("requestId")))
                if token is not None:
                    self.trial(token).mark("notice", arrived)
            await _answer(send, 202, b"")
            return
        if method == "initialize":
            result: dict[str, Any] = {"protocolVersion": "2025-11-25", "capabilities": {"tools": {}},
                                      "serverInfo": {"name": "hold-upstream", "version": "1"}}
            await _answer(send, 200, _result(msg["id"], result), [(b"mcp-session-id", self.session.encode())])
            return
        params = msg.get("params") or {}
        if method == "tools/call" and params.get("name") == "hold":
            await self._hold(msg, str((params.get("arguments") or {}).get("token")), arrived, receive, send)
            return
        await _answer(send, 200, _result(msg["id"], ECHO))

    async def _hold(self, msg: dict[str, Any], token: str, arrived: float, receive: Receive,
                    send: Send) -> None:
        trial = self.trial(token)
        self.by_request[json.dumps(msg["id"])] = token
        trial.mark("held", arrived)
        gone = asyncio.ensure_future(_disconnected(receive))
        told = asyncio.ensure_future(trial.events["notice"].wait())
        try:
            await asyncio.wait({gone, told}, timeout=HOLD_S, return_when=asyncio.FIRST_COMPLETED)
        finally:
            told.cancel()
        if gone.done():
            trial.mark("closed", gone.result())
            return
        await _answer(send, 200, _result(msg["id"], ECHO))
        # the gateway gave up on it, so it may still drop the connection: note when
        with contextlib.suppress(TimeoutError):
            trial.mark("closed", await asyncio.wait_for(gone, 5.0))
        gone.cancel()


async def _disconnected(receive: Receive) -> float:
    while (await receive())["type"] != "http.disconnect":
        pass
    return time.monotonic()


def _result(request_id: Any, result: dict[str, Any]) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": request_id, "result": result}).encode()


async def _answer(send: Send, status: int, body: bytes,
                  headers: list[tuple[bytes, bytes]] | None = None) -> None:
    head = [(b"content-length", str(len(body)).encode()), *(headers or [])]
    if body:
        head.append((b"content-type", b"application/json"))
    await send({"type": "http.response.start", "status": status, "headers": head})
    await send({"type": "http.response.body", "body": body})


async def serve(port: int) -> None:
    from hypercorn.asyncio import serve as hypercorn_serve
    from hypercorn.config import Config

    config = Config()
    config.bind = [f"127.0.0.1:{port}"]
    config.accesslog = None
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await hypercorn_serve(HoldUpstream(), config, shutdown_trigger=stop.wait)  # type: ignore[arg-type]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--port", type=int, required=True)
    asyncio.run(serve(parser.parse_args().port))


if __name__ == "__main__":
    main()
