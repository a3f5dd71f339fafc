"""The cluster soak's callers, each looping on `echo` with a unique text until the run's end:

* `sdk_caller`: the official Python SDK client (mcp 2.3) in a 2025-11-25 session
  (tests/e2e/sdk_client.py's `connect`), whose POST streams resume with GET + `Last-Event-ID`
  when they break; a session that fails is opened again, under a new principal;
* `modern_caller`: raw 2026-07-28 sessionless POSTs (httpx), one principal per caller.

Every principal is unique (the JWT's `sub`) and every request id is unique for its principal,
so an answered call is found in the audit log by (principal, request id). The SDK client's
HTTP goes through `Wiretap`, which tells which calls were answered on a resumed stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import random
import secrets
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import httpx2
from mcp import MCPError
from paths import MODERN
from soak import AUDIENCE, ISSUER, answers

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository: tests.e2e
from tests.e2e.sdk_client import connect  # (after the path it needs)

CALL_TIMEOUT_S = 30.0  # a call not answered by then is a client-visible timeout
PAUSE_AFTER_ERROR_S = 0.2  # a caller refused does not spin against the cluster


@dataclass
class Answered:
    """One call the client got its own text back for."""

    era: str  # "sdk" or "modern"
    principal: str
    request_id: str
    session_hash: str | None
    resumed: bool  # the answer came on a GET with Last-Event-ID
    at: float  # seconds into the run


@dataclass
class Tally:
    began: float  # time.monotonic() at the start of traffic
    end: float  # no call starts after this
    answered: list[Answered] = field(default_factory=list)
    outcomes: Counter[str] = field(default_factory=Counter)
    resumes: int = 0  # GETs with Last-Event-ID the SDK clients sent

    def now(self) -> float:
        return time.monotonic() - self.began

    def running(self) -> bool:
        return time.monotonic() < self.end


def token(secret: str, subject: str) -> str:
    import jwt  # the gateway's venv has it

    now = int(time.time())
    return "Bearer " + jwt.encode({"iss": ISSUER, "sub": subject, "aud": AUDIENCE, "iat": now,
                                   "exp": now + 86400}, secret, algorithm="HS256")


def session_hash(session_id: str) -> str:
    """What the audit log keeps of a session id (proxy.state.sessions.session_hash)."""
    return hashlib.sha256(session_id.encode()).hexdigest()[:16]


class _Tee(httpx2.AsyncByteStream):
    """A response body passed on as it comes, noting the id of each JSON-RPC answer in it."""

    def __init__(self, inner: Any, answered: set[str]) -> None:
        self._inner, self._answered = inner, answered

    async def __aiter__(self) -> AsyncIterator[bytes]:
        rest = b""
        async for chunk in self._inner:
            # read before it is passed on: the reader closes the stream once it has the answer
            *lines, rest = (rest + chunk).split(b"\n")
            for line in lines:
                if line.startswith(b"data:"):
                    with contextlib.suppress(ValueError):
                        message = json.loads(line[5:])
                        if isinstance(message, dict) and ("result" in message
                                                          or "error" in message):
                            self._answered.add(str(message.get("id")))
            yield chunk

    async def aclose(self) -> None:
        await self._inner.aclose()


class Wiretap(httpx2.AsyncBaseTransport):
    """The SDK client's HTTP, watched: the id of the last tools/call it POSTed, and the ids
    answered on a GET that resumes a stream (one with `Last-Event-ID`)."""

    def __init__(self) -> None:
        self._inner = httpx2.AsyncHTTPTransport()
        self.last_call: str | None = None
        self.resumed: set[str] = set()
        self.resumes = 0

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        if request.method == "POST":
            with contextlib.suppress(ValueError, httpx2.RequestNotRead):
                message = json.loads(request.content)
                if isinstance(message, dict) and message.get("method") == "tools/call":
                    self.last_call = str(message.get("id"))
        response = await self._inner.handle_async_request(request)
        if request.method == "GET" and "last-event-id" in request.headers:
            self.resumes += 1
            response.stream = _Tee(response.stream, self.resumed)
        return response

    async def aclose(self) -> None:
        await self._inner.aclose()


def _kind(exc: BaseException) -> str:
    if isinstance(exc, MCPError):
        return f"error {exc.code} {exc.error.message[:70]}"
    return type(exc).__name__


async def sdk_caller(n: int, url: str, secret: str, tally: Tally, max_delay_ms: int,
                     rng: random.Random) -> None:
    """Sessions of the official SDK client, one after another, each calling until it fails
    or the run ends."""
    generation = 0
    while tally.running():
        generation += 1
        principal = f"soak-sdk{n}.{generation}"
        tap = Wiretap()
        http = httpx2.AsyncClient(transport=tap, timeout=httpx2.Timeout(CALL_TIMEOUT_S))
        opened = False
        try:
            async with connect(url, headers={"authorization": token(secret, principal)},
                               http_client=http, read_timeout_seconds=CALL_TIMEOUT_S) as client:
                opened = True
                sid = session_hash(client.session_id) if client.session_id else None
                await _sdk_calls(client, tap, principal, sid, tally, max_delay_ms, rng)
        except Exception as exc:  # noqa: BLE001 - the session ended: counted, a new one opened
            what = "session ended" if opened else "session not opened"
            tally.outcomes[f"sdk: {what}: {_kind(exc)}"] += 1
            await asyncio.sleep(PAUSE_AFTER_ERROR_S)
        finally:
            tally.resumes += tap.resumes
            await http.aclose()


async def _sdk_calls(client: Any, tap: Wiretap, principal: str, sid: str | None, tally: Tally,
                     max_delay_ms: int, rng: random.Random) -> None:
    k = 0
    while tally.running():
        k += 1
        text = f"{principal}/{k}/{secrets.token_hex(4)}"
        try:
            result = await client.call_tool("echo", {"text": text,
                                                     "delay_ms": rng.randint(0, max_delay_ms)})
        except MCPError as exc:
            tally.outcomes[f"sdk: {_kind(exc)}"] += 1
            if "Session terminated" in exc.error.message:
                return  # a new session, under a new principal
            await asyncio.sleep(PAUSE_AFTER_ERROR_S)
            continue
        got = next((c.text for c in result.content if getattr(c, "type", "") == "text"), None)
        if result.is_error or got != text:
            tally.outcomes["sdk: tool error" if result.is_error else "sdk: another text"] += 1
            continue
        rid = tap.last_call or "?"
        resumed = rid in tap.resumed
        tally.answered.append(Answered("sdk", principal, rid, sid, resumed, tally.now()))
        tally.outcomes["sdk: result" + (" on a resumed stream" if resumed else "")] += 1


async def modern_caller(n: int, url: str, secret: str, tally: Tally, max_delay_ms: int,
                        rng: random.Random) -> None:
    """Sessionless 2026-07-28 calls, one at a time, each POST on its own."""
    principal = f"soak-modern{n}"
    headers = {"authorization": token(secret, principal), "content-type": "application/json",
               "accept": "application/json, text/event-stream", "mcp-protocol-version": MODERN,
               "mcp-method": "tools/call", "mcp-name": "echo"}
    meta = {"io.modelcontextprotocol/protocolVersion": MODERN,
            "io.modelcontextprotocol/clientCapabilities": {},
            "io.modelcontextprotocol/clientInfo": {"name": "cluster-soak", "version": "1"}}
    async with httpx.AsyncClient(timeout=CALL_TIMEOUT_S) as http:
        k = 0
        while tally.running():
            k += 1
            rid, text = f"m{n}-{k}", f"{principal}/{k}/{secrets.token_hex(4)}"
            body = {"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": {
                "name": "echo", "arguments": {"text": text,
                                              "delay_ms": rng.randint(0, max_delay_ms)},
                "_meta": meta}}
            try:
                response = await http.post(url, headers=headers, json=body)
            except httpx.HTTPError as exc:
                tally.outcomes[f"modern: transport {type(exc).__name__}"] += 1
                await asyncio.sleep(PAUSE_AFTER_ERROR_S)
                continue
            mine = [m for m in answers(response) if m.get("id") == rid]
            if not mine:
                tally.outcomes[f"modern: HTTP {response.status_code}, no answer"] += 1
                await asyncio.sleep(PAUSE_AFTER_ERROR_S)
                continue
            error, result = mine[-1].get("error"), mine[-1].get("result") or {}
            if error:
                tally.outcomes[f"modern: error {error.get('code')} "
                               f"{str(error.get('message'))[:70]}"] += 1
                await asyncio.sleep(PAUSE_AFTER_ERROR_S)
                continue
            got = next((c.get("text") for c in result.get("content", [])
                        if c.get("type") == "text"), None)
            if result.get("isError") or got != text:
                tally.outcomes["modern: tool error" if result.get("isError")
                               else "modern: another text"] += 1
                continue
            tally.answered.append(Answered("modern", principal, rid, None, False, tally.now()))
            tally.outcomes["modern: result"] += 1
