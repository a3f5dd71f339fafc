"""Upstream MCP servers for the end-to-end tests, built with the official SDK (mcp 2.3).

Each builder returns ``(asgi_app, probe)``:

* ``stateful_sse_app()``   - stateful sessions (``Mcp-Session-Id``), request POSTs answered
  with ``text/event-stream``; GET stream and DELETE supported.
* ``stateless_json_app()`` - no sessions, request POSTs answered with ``application/json``.

Both serve the Streamable HTTP endpoint at ``/mcp`` (Starlette app; ``/mcp/`` gets a 307
redirect to ``/mcp``) and speak both protocol eras: a request whose ``MCP-Protocol-Version``
header is a handshake-era version (``2024-11-05`` .. ``2025-11-25``) or absent goes to the
legacy (initialize + session) transport; any other value goes to the SDK's 2026-07-28
sessionless handler.

Tools (identical on both apps):

* ``echo(text) -> text``
* ``large_text(size) -> text`` - ``size`` characters of ``LARGE_PATTERN`` (quotes, backslashes,
  a newline and non-ASCII: what a scanner of the answer must step over).
* ``slow_progress(steps) -> "done"`` - ``ctx.report_progress(i, steps)`` ``steps`` times.
  The progress notifications only exist on the wire when the POST is answered with SSE:
  in JSON-response mode the SDK drops them, so a client sees none from ``stateless_json_app``.
* ``ask_sampling(prompt, standalone=False)`` - sends ``sampling/createMessage`` to the client
  and returns the text the client answered. ``standalone=False`` sends it on the tool call's
  own POST SSE stream (related request); ``standalone=True`` on the session's GET stream.
  In JSON-response mode / stateless mode the SDK has no back-channel: the tool fails with
  a JSON-RPC error ``-32600`` (``NoBackChannelError``), nothing is sent to the client.
* ``ask_elicitation(message)`` - ``elicitation/create`` (form mode, one string field ``answer``);
  returns ``"<action>:<answer>"``.
* ``ask_roots()`` - ``roots/list``; returns the root URIs joined with ``","``.
* ``wait_forever()`` - blocks until cancelled; sets ``probe.started`` on entry and
  ``probe.cancelled`` when it is cancelled (then re-raises the cancellation).
* ``boom()`` - raises ``RuntimeError``: the SDK turns it into a *successful* JSON-RPC response
  whose result is ``CallToolResult(isError=True, content=[text "Error executing tool boom"])``
  (the exception text is not leaked; the traceback is logged at ERROR on the
  ``mcp.server.mcpserver.server`` logger).
* ``boom_rpc()`` - raises ``MCPError(-32050, "boom_rpc")``: the SDK answers with a JSON-RPC
  *error* response carrying that code/message.

The probe (``UpstreamProbe``) also records every tool call (``probe.calls``: name, arguments,
HTTP headers, protocol version) and every HTTP exchange (``probe.exchanges``: method, path,
request headers/body, status, response headers/body as streamed); ``probe.posts(method)``
and ``await probe.wait_exchange(predicate)`` help assert on what the upstream received.

Wire notes (SDK server): SSE events are framed ``event: message\r\ndata: <json>\r\n\r\n``
(CRLF), without ``id:``/``retry:`` (no event store); sse-starlette adds a ``: ping - <time>``
comment every 15 s on open streams. Notifications and client responses POSTed to the server
get ``202`` with an empty body and ``Content-Type: application/json``.

Side effect: ``MCPServer()`` calls ``logging.basicConfig(level="INFO")`` (a no-op when the root
logger already has handlers, as it does inside a running pytest test).

``serve_asgi(app)`` runs an app on Hypercorn on 127.0.0.1 (ephemeral port) in the current
event loop and yields its base URL (``http://127.0.0.1:PORT``; the endpoint is ``+ "/mcp"``).
Hypercorn drives the ASGI lifespan, which runs the SDK's ``session_manager.run()``; an app
(its session manager) can be served ONCE: build a fresh app per server.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.lowlevel
from mcp import types
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.exceptions import MCPError
from mcp.shared.message import ServerMessageMetadata
from pydantic import BaseModel

from tests.servers import serve

__all__ = [
    "ASGIApp",
    "Exchange",
    "ToolCall",
    "UpstreamProbe",
    "build_app",
    "serve_asgi",
    "stateful_sse_app",
    "stateless_json_app",
]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

BOOM_RPC_CODE = -32050
LARGE_PATTERN = 'tollhouse \u00e9 "quoted" \\ back\nslash '  # what large_text repeats


@dataclass
class ToolCall:
    """One tool invocation as the upstream saw it."""

    name: str
    arguments: dict[str, Any]
    headers: dict[str, str]
    """HTTP headers of the POST that carried the ``tools/call`` (lower-cased names)."""
    protocol_version: str | None


@dataclass
class Exchange:
    """One HTTP exchange seen by the upstream (recorded by the wrapping ASGI middleware)."""

    method: str
    path: str
    request_headers: list[tuple[str, str]]
    request_body: bytes = b""
    status: int | None = None
    response_headers: list[tuple[str, str]] = field(default_factory=list)
    response_body: bytes = b""
    done: bool = False

    @property
    def rpc(self) -> Any:
        """The JSON-RPC message of a POST body (None when there is none / it is not JSON)."""
        if not self.request_body:
            return None
        try:
            return json.loads(self.request_body)
        except ValueError:
            return None

    @property
    def rpc_method(self) -> str | None:
        msg = self.rpc
        return msg.get("method") if isinstance(msg, dict) else None

    def request_header(self, name: str) -> str | None:
        name = name.lower()
        return next((v for k, v in self.request_headers if k == name), None)

    def response_header(self, name: str) -> str | None:
        name = name.lower()
        return next((v for k, v in self.response_headers if k == name), None)


@dataclass
class UpstreamProbe:
    """Observation hooks shared between an upstream app and the test that drives it.

    The asyncio events are created unbound; they bind to the loop that first waits on
    them, so use one probe per test (per event loop).
    """

    started: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when ``wait_forever`` starts running."""
    cancelled: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when a ``wait_forever`` invocation is cancelled (by ``notifications/cancelled``, a
    DELETE of its session, the end of its stateless request, or server shutdown)."""
    started_count: int = 0
    cancelled_count: int = 0
    calls: list[ToolCall] = field(default_factory=list)
    exchanges: list[Exchange] = field(default_factory=list)
    """Every HTTP request that reached the app, in arrival order (recorded as it streams)."""

    _exchange_tick: asyncio.Event = field(default_factory=asyncio.Event, repr=False)

    def _exchange_finished(self) -> None:
        tick, self._exchange_tick = self._exchange_tick, asyncio.Event()
        tick.set()

    def posts(self, rpc_method: str) -> list[Exchange]:
        """Recorded POSTs whose JSON-RPC body has this ``method`` (e.g. "notifications/cancelled")."""
        return [ex for ex in self.exchanges if ex.method == "POST" and ex.rpc_method == rpc_method]

    async def wait_exchange(self, predicate: Callable[[Exchange], bool]) -> Exchange:
        """Wait (no timeout: wrap in anyio.fail_after) for a *finished* exchange matching `predicate`."""
        while True:
            tick = self._exchange_tick
            for ex in self.exchanges:
                if ex.done and predicate(ex):
                    return ex
            await tick.wait()

    def reset_wait_events(self) -> None:
        self.started = asyncio.Event()
        self.cancelled = asyncio.Event()

    def tool_calls(self, name: str) -> list[ToolCall]:
        return [c for c in self.calls if c.name == name]


class _ElicitAnswer(BaseModel):
    answer: str


def _build_server(probe: UpstreamProbe, name: str) -> MCPServer:
    server = MCPServer(name, version="1.0.0")

    def record(tool: str, arguments: dict[str, Any], ctx: Context) -> None:
        headers = {k.lower(): v for k, v in (ctx.headers or {}).items()}
        probe.calls.append(ToolCall(tool, arguments, headers, ctx.protocol_version))

    @server.tool()
    async def echo(text: str, ctx: Context) -> str:
        """Return the text unchanged."""
        record("echo", {"text": text}, ctx)
        return text

    @server.tool()
    async def large_text(size: int, ctx: Context) -> str:
        """A text of `size` characters with quotes, backslashes and non-ASCII in it."""
        record("large_text", {"size": size}, ctx)
        return (LARGE_PATTERN * (size // len(LARGE_PATTERN) + 1))[:size]

    @server.tool()
    async def slow_progress(steps: int, ctx: Context) -> str:
        """Report progress `steps` times, then return "done"."""
        record("slow_progress", {"steps": steps}, ctx)
        for i in range(1, steps + 1):
            await ctx.report_progress(i, steps, f"step {i}/{steps}")
            await anyio.lowlevel.checkpoint()
        return "done"

    @server.tool()
    async def ask_sampling(prompt: str, ctx: Context, standalone: bool = False) -> str:
        """Ask the client to sample (sampling/createMessage) and return its text."""
        record("ask_sampling", {"prompt": prompt, "standalone": standalone}, ctx)
        request = types.CreateMessageRequest(
            params=types.CreateMessageRequestParams(
                messages=[types.SamplingMessage(role="user", content=types.TextContent(type="text", text=prompt))],
                max_tokens=64,
            )
        )
        # ServerSession.create_message() is @deprecated (MCPDeprecationWarning, a UserWarning,
        # which filterwarnings=error turns into an exception): use the generic send_request.
        metadata = None if standalone else ServerMessageMetadata(related_request_id=ctx.request_context.request_id)
        result = await ctx.session.send_request(request, types.CreateMessageResult, metadata=metadata)
        content = result.content
        if isinstance(content, types.TextContent):
            return content.text
        return repr(content)

    @server.tool()
    async def ask_elicitation(message: str, ctx: Context) -> str:
        """Ask the client for a form elicitation; return "<action>:<answer>"."""
        record("ask_elicitation", {"message": message}, ctx)
        result = await ctx.elicit(message, _ElicitAnswer)
        answer = result.data.answer if result.action == "accept" else ""
        return f"{result.action}:{answer}"

    @server.tool()
    async def ask_roots(ctx: Context) -> str:
        """Ask the client for its roots (roots/list); return the URIs joined with ','."""
        record("ask_roots", {}, ctx)
        # ServerSession.list_roots() is @deprecated too; same workaround as ask_sampling.
        result = await ctx.session.send_request(
            types.ListRootsRequest(),
            types.ListRootsResult,
            metadata=ServerMessageMetadata(related_request_id=ctx.request_context.request_id),
        )
        return ",".join(str(root.uri) for root in result.roots)

    @server.tool()
    async def wait_forever(ctx: Context) -> str:
        """Block until cancelled."""
        record("wait_forever", {}, ctx)
        probe.started_count += 1
        probe.started.set()
        try:
            await anyio.sleep_forever()
        except anyio.get_cancelled_exc_class():
            probe.cancelled_count += 1
            probe.cancelled.set()
            raise
        return "unreachable"  # pragma: no cover

    @server.tool()
    async def boom(ctx: Context) -> str:
        """Raise an exception (becomes a CallToolResult with isError=true)."""
        record("boom", {}, ctx)
        raise RuntimeError("boom")

    @server.tool()
    async def boom_rpc(ctx: Context) -> str:
        """Raise MCPError (becomes a JSON-RPC error response)."""
        record("boom_rpc", {}, ctx)
        raise MCPError(code=BOOM_RPC_CODE, message="boom_rpc")

    return server


def _recording(app: ASGIApp, probe: UpstreamProbe) -> ASGIApp:
    """Wrap `app` so every HTTP exchange is appended to ``probe.exchanges`` as it happens."""

    async def wrapped(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        exchange = Exchange(
            method=scope["method"],
            path=scope["path"],
            request_headers=[(k.decode("latin-1").lower(), v.decode("latin-1")) for k, v in scope["headers"]],
        )
        probe.exchanges.append(exchange)

        async def recv() -> Message:
            message = await receive()
            if message["type"] == "http.request":
                exchange.request_body += message.get("body", b"")
            return message

        async def snd(message: Message) -> None:
            if message["type"] == "http.response.start":
                exchange.status = message["status"]
                exchange.response_headers = [
                    (k.decode("latin-1").lower(), v.decode("latin-1")) for k, v in message.get("headers", [])
                ]
            elif message["type"] == "http.response.body":
                exchange.response_body += message.get("body", b"")
            await send(message)

        try:
            await app(scope, recv, snd)
        finally:
            exchange.done = True
            probe._exchange_finished()

    return wrapped


NOT_INITIALIZED = {"jsonrpc": "2.0", "id": None,
                   "error": {"code": -32000, "message": "Bad Request: Server not initialized"}}
LEGACY_REVISIONS = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")


def _refusing_2026(app: ASGIApp) -> ASGIApp:
    """A legacy-only server that knows nothing of 2026-07-28: any POST carrying a marker of it
    (an ``io.modelcontextprotocol/*`` key in ``params._meta``, an ``Mcp-Method``, ``Mcp-Name``
    or ``Mcp-Param-*`` header, an ``MCP-Protocol-Version`` of another revision) is answered
    HTTP 400 ``-32000 Bad Request: Server not initialized``, as TypeScript SDK v1 servers
    answer it. The body is read up front and replayed to the app."""

    async def wrapped(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await app(scope, receive, send)
            return
        body = b""
        more = True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        try:
            msg = json.loads(body)
        except ValueError:
            msg = None
        params = msg.get("params") if isinstance(msg, dict) else None
        meta = params.get("_meta") if isinstance(params, dict) else None
        version = headers.get("mcp-protocol-version")
        if (isinstance(meta, dict) and any(k.startswith("io.modelcontextprotocol/") for k in meta)) \
                or any(k in ("mcp-method", "mcp-name") or k.startswith("mcp-param-") for k in headers) \
                or (version is not None and version not in LEGACY_REVISIONS):
            payload = json.dumps(NOT_INITIALIZED).encode()
            await send({"type": "http.response.start", "status": 400,
                        "headers": [(b"content-type", b"application/json")]})
            await send({"type": "http.response.body", "body": payload})
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await app(scope, replay, send)

    return wrapped


def _cancelling_on_disconnect(app: ASGIApp) -> ASGIApp:
    """Cancel the handling of a POST when its client disconnects before the response is done.

    The SDK never does this by itself (the 2025 spec says a disconnect is not a cancellation).
    For a stateless upstream, cancelling the request's handling terminates its per-request
    transport, which cancels the tool: this is the only way a stateless upstream can observe
    a client going away. The body is read up front and replayed to the app.
    """

    async def wrapped(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await app(scope, receive, send)
            return
        body: list[Message] = []
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body.append(message)
            if not message.get("more_body", False):
                break
        disconnected = anyio.Event()

        async def replay() -> Message:
            if body:
                return body.pop(0)
            await disconnected.wait()
            return {"type": "http.disconnect"}

        async with anyio.create_task_group() as tg:

            async def watch() -> None:
                while (await receive())["type"] != "http.disconnect":
                    pass
                disconnected.set()
                tg.cancel_scope.cancel()

            tg.start_soon(watch)
            await app(scope, replay, send)
            tg.cancel_scope.cancel()

    return wrapped


def build_app(
    *,
    stateless: bool,
    json_response: bool,
    name: str = "tollhouse-upstream",
    dns_rebinding_protection: bool = True,
    session_idle_timeout: float | None = None,
    cancel_on_disconnect: bool = False,
    legacy_only: bool = False,
) -> tuple[ASGIApp, UpstreamProbe]:
    """Build an upstream app with the given transport flavour; see the module docstring.

    ``dns_rebinding_protection=True`` (the SDK's default for a 127.0.0.1 host) makes the
    upstream answer 421 unless ``Host`` is ``127.0.0.1:*``, ``localhost:*`` or ``[::1]:*``
    and 403 for a foreign ``Origin``.

    ``cancel_on_disconnect=True`` adds a (non-SDK) middleware that cancels a POST's handling
    when the HTTP client disconnects mid-request. Only meaningful for ``stateless=True``:
    there, ``notifications/cancelled`` can never reach the tool (each POST gets a fresh
    per-request transport that does not know the request id), so a dropped connection is the
    only cancellation signal it can see. In stateful mode tools run in the session's task
    group and are cancelled only by ``notifications/cancelled``, DELETE or shutdown.

    ``legacy_only=True`` refuses every POST that claims a revision after 2025-11-25, as
    servers on the TypeScript SDK v1 do (see ``_refusing_2026``).
    """
    probe = UpstreamProbe()
    server = _build_server(probe, name)
    security = (
        None  # streamable_http_app() then enables the 127.0.0.1/localhost allow-list itself
        if dns_rebinding_protection
        else TransportSecuritySettings(enable_dns_rebinding_protection=False)
    )
    app = server.streamable_http_app(
        streamable_http_path="/mcp",
        json_response=json_response,
        stateless_http=stateless,
        session_idle_timeout=session_idle_timeout,
        transport_security=security,
    )
    asgi: ASGIApp = app
    if cancel_on_disconnect:
        asgi = _cancelling_on_disconnect(asgi)
    if legacy_only:
        asgi = _refusing_2026(asgi)
    return _recording(asgi, probe), probe


def stateful_sse_app(**kwargs: Any) -> tuple[ASGIApp, UpstreamProbe]:
    """Stateful sessions, SSE responses to request POSTs."""
    return build_app(stateless=False, json_response=False, **kwargs)


def stateless_json_app(**kwargs: Any) -> tuple[ASGIApp, UpstreamProbe]:
    """Stateless (no Mcp-Session-Id), JSON responses to request POSTs."""
    return build_app(stateless=True, json_response=True, **kwargs)


def holding_app() -> tuple[ASGIApp, asyncio.Event, asyncio.Event]:
    """A stateless official-SDK upstream (JSON answers) whose tool `hold` answers only once
    `release` is set (`started` says it is waiting), and `echo`: a call in flight whose end
    the test decides, without a sleep."""
    started, release = asyncio.Event(), asyncio.Event()
    server = MCPServer("holding", version="1.0.0")

    @server.tool()
    async def hold() -> str:
        """Wait for the test, then answer."""
        started.set()
        await release.wait()
        return "released"

    @server.tool()
    async def echo(text: str) -> str:
        """Return the text unchanged."""
        return text

    app = server.streamable_http_app(streamable_http_path="/mcp", json_response=True,
                                     stateless_http=True)
    return app, started, release


# The same loopback Hypercorn fixture as every other real-server test.
serve_asgi = serve
