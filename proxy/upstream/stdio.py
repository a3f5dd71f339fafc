"""A stdio upstream, presented to the gateway as a 2025-11-25 Streamable HTTP server.

`StdioTransport` is an httpx transport: the forwarding step sends it POST, GET and DELETE with
an `Mcp-Session-Id` exactly as it would an HTTP upstream, and the sessions, the bridge for
2026-07-28 callers, the policies and the audit work unchanged. Underneath, each request goes to
one supervised process (proxy.upstream.supervisor, proxy.upstream.pool) on its stdin, under the process's own id;
the answer comes back as JSON when the process's first word on the call is the response, and
as an SSE stream otherwise (progress, log messages, server-to-client requests, then the
response). The sessions are this transport's own: the process was opened once, by the
gateway, so a session is a label on the callers of one process, and a session id this
replica never issued (a session moved from another replica, a process restarted) is taken
up as it is.

What the process sends is routed back to the caller it is for: a response by the process's
own id, progress by its token (rewritten per process too); a log message or a server-to-client
request carries no request id on stdio, so it goes to the one session with calls in flight
(for per_user, the person's latest call), and a server request that could belong to several
sessions is refused to the process rather than guessed. A server request goes to the caller
under an id minted here (random: nobody can guess another's), and an answer is taken only from
the session and person it was sent to: one from anyone else is dropped, and the request still
waits for the real answer. `list_changed` notifications reach every session's GET stream on the
process, `resources/updated` the sessions that subscribed.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson

from proxy.config import UpstreamConfig
from proxy.errors import jsonrpc_error_body
from proxy.upstream.pool import Pool
from proxy.upstream.supervisor import EXITED, Call, Child, Spec, Unavailable

log = logging.getLogger("tollhouse.stdio")

PERSON_HEADER = "x-tollhouse-person"  # set by the forwarding step for a stdio route
MAX_SESSIONS = 100_000
SESSION_IDLE_S = 86_400.0
JSON = [(b"content-type", b"application/json")]
SSE = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]


@dataclass(slots=True, eq=False)
class _Session:
    id: str
    key: str
    used: float
    subscriptions: set[str] = field(default_factory=set)
    listeners: set[asyncio.Queue[Any]] = field(default_factory=set)


@dataclass(frozen=True, slots=True)
class _Asked:
    """A server-to-client request on its way to a caller: the process and its own id, and the
    only session and person whose answer is taken."""

    child: Child
    child_id: Any
    session: str
    person: str


class StdioTransport(httpx.AsyncBaseTransport):
    """One stdio upstream's processes behind the Streamable HTTP surface (module docstring)."""

    def __init__(self, cfg: UpstreamConfig) -> None:
        self.spec = Spec.from_config(cfg)
        if not self.spec.run_as:  # at start-up and on a reload that changes it
            log.warning("stdio upstream %s runs as the gateway's own user%s, without run_as: "
                        "it can read and write every file the gateway can, its database "
                        "included; set run_as to a user of its own", cfg.name,
                        " (root)" if os.geteuid() == 0 else "")
        self.pool = Pool(self.spec, self._deliver)
        self._sessions: dict[str, _Session] = {}
        # the id a server-to-client request got on its way to a caller -> where it came from
        self._asked: dict[str, _Asked] = {}

    # -- the HTTP surface -------------------------------------------------------------------

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        headers = request.headers
        sid = headers.get("mcp-session-id")
        key = ""
        if self.spec.per_user:  # the person a call names; a GET or a notice: its session's
            known = self._sessions.get(sid) if sid is not None else None
            key = headers.get(PERSON_HEADER) or (known.key if known is not None else "")
        if request.method == "GET":
            return self._listen(request, self._session(sid, key))
        if request.method == "DELETE":
            return await self._end(request, sid)
        if request.method != "POST":
            return httpx.Response(405, headers={"allow": "GET, POST, DELETE"}, request=request)
        try:
            message = orjson.loads(request.content)
        except orjson.JSONDecodeError:
            return _error(request, 400, -32700, "Parse error")
        if not isinstance(message, dict):
            return _error(request, 400, -32600, "Invalid Request")
        token = _bearer(headers.get("authorization"))
        person = headers.get(PERSON_HEADER, "")
        if "method" not in message:
            await self._answer_child(message, sid or "", person)
            return httpx.Response(202, request=request)
        if "id" not in message:
            await self._notify(message, sid, key)
            return httpx.Response(202, request=request)
        child = await self._child(request, key, token)
        if message["method"] == "initialize":
            session = self._open(secrets.token_urlsafe(24), key)
            body = orjson.dumps({"jsonrpc": "2.0", "id": message["id"],
                                 "result": child.initialize_result})
            return httpx.Response(200, headers=[*JSON, (b"mcp-session-id", session.id.encode())],
                                  content=body, request=request)
        session = self._session(sid, key)
        return await self._call(request, child, session, person, message)

    async def _child(self, request: httpx.Request, key: str, token: str | None) -> Child:
        try:
            return await self.pool.child(key, token)
        except Unavailable as exc:
            raise httpx.ConnectError(f"stdio upstream {self.spec.name}: {exc}",
                                     request=request) from None

    async def _call(self, request: httpx.Request, child: Child, session: _Session,
                    person: str, message: dict[str, Any]) -> httpx.Response:
        call = child.open_call(session.id, message["id"], person)
        out = dict(message, id=call.child_id)
        params = message.get("params")
        if isinstance(params, dict):
            meta = params.get("_meta")
            if isinstance(meta, dict) and "progressToken" in meta:
                call.progress_token = meta["progressToken"]
                token = f"p{call.child_id}"
                child.progress[token] = call
                out["params"] = dict(params, _meta=dict(meta, progressToken=token))
            uri = params.get("uri")
            if isinstance(uri, str) and message["method"] == "resources/subscribe":
                session.subscriptions.add(uri)
            elif isinstance(uri, str) and message["method"] == "resources/unsubscribe":
                session.subscriptions.discard(uri)
        read_s = request.extensions.get("timeout", {}).get("read")
        try:
            await child.send(out)
            first = await _next(call, request, read_s)
        except BaseException:
            await self._abandon(child, call)
            raise
        if "method" not in first:  # the answer itself: plain JSON
            child.close_call(call)
            return httpx.Response(200, headers=JSON, content=orjson.dumps(first),
                                  request=request)
        return httpx.Response(200, headers=SSE, stream=_CallStream(self, child, call, first,
                                                                   request, read_s),
                              request=request)

    async def _abandon(self, child: Child, call: Call) -> None:
        """The caller went away before the answer: the process is told, with its own id."""
        if child.calls.get(call.child_id) is not call:
            return
        child.close_call(call)
        try:
            await child.send({"jsonrpc": "2.0", "method": "notifications/cancelled",
                              "params": {"requestId": call.child_id,
                                         "reason": "the caller went away"}})
        except Unavailable:
            pass

    async def _notify(self, message: dict[str, Any], sid: str | None, key: str) -> None:
        method = message["method"]
        if method == "notifications/initialized":
            return  # the gateway opened the process itself
        child = self.pool.current(key)
        if child is None:
            return  # nothing running to tell (a cancel for a call of a process now gone)
        if method == "notifications/cancelled":
            params = message.get("params") or {}
            target = params.get("requestId") if isinstance(params, dict) else None
            call = next((c for c in child.calls.values()
                         if c.session == (sid or "") and c.caller_id == target), None)
            if call is None:
                return
            message = {"jsonrpc": "2.0", "method": method,
                       "params": {**params, "requestId": call.child_id}}
        try:
            await child.send(message)
        except Unavailable:
            pass

    async def _answer_child(self, message: dict[str, Any], sid: str, person: str) -> None:
        """A caller's answer to a server-to-client request, under the process's own id: only
        from the session and person it was asked of. Any other (forged, guessed, another
        caller's) is dropped, as an HTTP upstream drops an answer to no request of its own,
        and the request stays open for its own caller's answer."""
        key = str(message.get("id"))
        asked = self._asked.get(key)
        if asked is None or asked.session != sid or asked.person != person:
            log.info("stdio upstream %s: an answer to no request of this caller's: dropped",
                     self.spec.name)
            return
        del self._asked[key]
        try:
            await asked.child.send({**message, "id": asked.child_id})
        except Unavailable:
            pass

    def _listen(self, request: httpx.Request, session: _Session) -> httpx.Response:
        queue: asyncio.Queue[Any] = asyncio.Queue(maxsize=1000)
        session.listeners.add(queue)
        return httpx.Response(200, headers=SSE, stream=_Listen(session, queue),
                              request=request)

    async def _end(self, request: httpx.Request, sid: str | None) -> httpx.Response:
        session = self._sessions.pop(sid, None) if sid else None
        if session is None:
            return httpx.Response(404, request=request)
        for queue in session.listeners:
            queue.put_nowait(EXITED)
        child = self.pool.current(session.key)
        if child is not None:  # its calls still in flight end with it; the process stays
            for call in [c for c in child.calls.values() if c.session == session.id]:
                await self._abandon(child, call)
                call.put(EXITED)
        return httpx.Response(200, request=request)

    # -- sessions ---------------------------------------------------------------------------

    def _open(self, sid: str, key: str) -> _Session:
        now = time.monotonic()
        if len(self._sessions) >= MAX_SESSIONS:
            self._prune(now)
        session = self._sessions[sid] = _Session(sid, key, now)
        return session

    def _session(self, sid: str | None, key: str) -> _Session:
        if sid is None:
            return _Session("", key, time.monotonic())  # no session: nothing to route to
        session = self._sessions.get(sid)
        if session is None or session.key != key:
            return self._open(sid, key)  # issued elsewhere (another replica): taken up
        session.used = time.monotonic()
        return session

    def _prune(self, now: float) -> None:
        for sid, s in list(self._sessions.items()):
            if not s.listeners and now - s.used > SESSION_IDLE_S:
                del self._sessions[sid]
        while len(self._sessions) >= MAX_SESSIONS:
            del self._sessions[next(iter(self._sessions))]

    # -- what a process says ------------------------------------------------------------------

    def _deliver(self, child: Child, message: dict[str, Any]) -> None:
        method = message.get("method")
        if method is None:  # a response, by the process's own id
            call = child.calls.get(message.get("id"))  # type: ignore[arg-type]
            if call is not None:
                call.put({**message, "id": call.caller_id})
            return
        if "id" in message:
            self._server_request(child, message)
            return
        params = message.get("params")
        if method == "notifications/progress" and isinstance(params, dict):
            call = child.progress.get(str(params.get("progressToken")))
            if call is not None:
                call.put({**message, "params": {**params, "progressToken": call.progress_token}})
            return
        if method.endswith("/list_changed") or method == "notifications/resources/updated":
            uri = params.get("uri") if isinstance(params, dict) else None
            for session in self._sessions.values():
                if session.key == child.key and (uri is None or uri in session.subscriptions):
                    for queue in session.listeners:
                        if not queue.full():
                            queue.put_nowait(message)
            return
        call = self._attributed(child)
        if call is not None:
            call.put(message)

    def _server_request(self, child: Child, message: dict[str, Any]) -> None:
        if message["method"] == "ping":
            self._reply(child, orjson.dumps({"jsonrpc": "2.0", "id": message["id"],
                                             "result": {}}))
            return
        call = self._attributed(child)
        if call is None:
            self._reply(child, jsonrpc_error_body(
                -32603, "no single caller to ask: several sessions have calls in flight on "
                        "this process", message["id"]))
            return
        asked = secrets.token_urlsafe(16)
        if len(self._asked) >= MAX_SESSIONS:
            del self._asked[next(iter(self._asked))]
        self._asked[asked] = _Asked(child, message["id"], call.session, call.person)
        call.put({**message, "id": asked})

    def _attributed(self, child: Child) -> Call | None:
        """The call a message without a request id is for: the latest one, when every call in
        flight is one session's (or, per_user, one person's); None when that is not known."""
        calls = [c for c in child.calls.values() if c.session or c.child_id]
        if not calls:
            return None
        if not self.spec.per_user and len({c.session for c in calls}) != 1:
            return None
        return max(calls, key=lambda c: c.child_id)

    def _reply(self, child: Child, line: bytes) -> None:
        async def send() -> None:
            try:
                await child.send_line(line)
            except Unavailable:
                pass

        self.pool.spawn(send())

    async def aclose(self) -> None:
        for session in self._sessions.values():
            for queue in session.listeners:
                queue.put_nowait(EXITED)
        self._sessions.clear()
        await self.pool.aclose()


async def _next(call: Call, request: httpx.Request, read_s: float | None) -> Any:
    try:
        message = await asyncio.wait_for(call.queue.get(), read_s)
    except TimeoutError:
        raise httpx.ReadTimeout("stdio upstream: no answer in time", request=request) from None
    if message is EXITED:
        raise httpx.ReadError("stdio upstream: the process ended before it answered",
                              request=request)
    return message


def _event(message: Any) -> bytes:
    return b"event: message\ndata: " + orjson.dumps(message) + b"\n\n"


class _CallStream(httpx.AsyncByteStream):
    """One call's SSE answer: what the process said for it, up to and with the response."""

    def __init__(self, transport: StdioTransport, child: Child, call: Call, first: Any,
                 request: httpx.Request, read_s: float | None) -> None:
        self._transport, self._child, self._call = transport, child, call
        self._first, self._request, self._read_s = first, request, read_s
        self._done = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield _event(self._first)
        while True:
            message = await _next(self._call, self._request, self._read_s)
            yield _event(message)
            if "method" not in message:
                self._done = True
                self._child.close_call(self._call)
                return

    async def aclose(self) -> None:
        if not self._done:
            self._done = True
            await self._transport._abandon(self._child, self._call)


class _Listen(httpx.AsyncByteStream):
    """A session's GET stream: what the process says to every session, or to this one."""

    def __init__(self, session: _Session, queue: asyncio.Queue[Any]) -> None:
        self._session, self._queue = session, queue

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while True:
            message = await self._queue.get()
            if message is EXITED:
                return
            yield _event(message)

    async def aclose(self) -> None:
        self._session.listeners.discard(self._queue)


def _bearer(value: str | None) -> str | None:
    if value is None or not value.lower().startswith("bearer "):
        return None
    return value[7:].strip()


def _error(request: httpx.Request, status: int, code: int, message: str) -> httpx.Response:
    return httpx.Response(status, headers=JSON, content=jsonrpc_error_body(code, message),
                          request=request)


class LocalUpstreams:
    """The stdio upstreams' transports, by name: built with the routes, kept across reloads
    while an upstream's config is unchanged, and closed (every process stopped) when the
    upstream is removed or the gateway stops."""

    def __init__(self) -> None:
        self._by_name: dict[str, tuple[UpstreamConfig, StdioTransport]] = {}
        self._closing: set[asyncio.Task[None]] = set()

    def transport(self, cfg: UpstreamConfig) -> StdioTransport | None:
        if cfg.transport != "stdio":
            return None
        held = self._by_name.get(cfg.name)
        if held is not None and held[0] == cfg:
            return held[1]
        if held is not None:
            self._close_later(held[1])
        made = StdioTransport(cfg)
        self._by_name[cfg.name] = (cfg, made)
        return made

    def keep_only(self, names: set[str]) -> None:
        """A reload: every upstream not in `names` stops its processes."""
        for name in [n for n in self._by_name if n not in names]:
            self._close_later(self._by_name.pop(name)[1])

    def get(self, name: str) -> StdioTransport | None:
        held = self._by_name.get(name)
        return held[1] if held is not None else None

    def _close_later(self, transport: StdioTransport) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # not serving yet: nothing was started
            return
        task = loop.create_task(transport.aclose())
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def aclose(self) -> None:
        held, self._by_name = list(self._by_name.values()), {}
        await asyncio.gather(*(t.aclose() for _, t in held), return_exceptions=True)
        if self._closing:
            await asyncio.wait(set(self._closing))
