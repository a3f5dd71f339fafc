"""The official MCP Python SDK client (mcp 2.3), pinned to the legacy 2025-11-25 era.

Usage::

    async with connect(f"{base}/mcp", sampling_callback=on_sampling) as client:
        tools = await client.list_tools()                       # ListToolsResult
        res = await client.call_tool("echo", {"text": "hi"})   # CallToolResult
        client.session_id                                       # Mcp-Session-Id issued at initialize
        client.protocol_version                                 # "2025-11-25"
        await client.terminate()                                # DELETE; returns the HTTP status

Why not ``mcp.Client(url)``: its default ``mode="auto"`` first probes ``server/discover`` with
``MCP-Protocol-Version: 2026-07-28`` and, against a server that answers it (the mcp 2.3 SDK
server does, stateful or not), adopts the *sessionless* 2026-07-28 era: no ``initialize``, no ``Mcp-Session-Id``,
no GET stream. ``Client(url, mode="legacy")`` or - as here - a bare ``ClientSession`` plus
``session.initialize()`` performs the initialize handshake; the SDK always offers
``LATEST_HANDSHAKE_VERSION`` = ``"2025-11-25"`` there (not configurable). The initialize POST
itself carries no ``MCP-Protocol-Version`` header; every later HTTP request (POST, GET, DELETE)
carries ``MCP-Protocol-Version: <negotiated>``. ``connect()`` checks the negotiated
version is 2025-11-25.

How-to, on the yielded :class:`SdkClient` (attributes not defined here are forwarded to the
underlying :class:`mcp.ClientSession`, available as ``client.session``):

* list tools: ``await client.list_tools()``
* call a tool: ``await client.call_tool(name, arguments, read_timeout_seconds=None,
  progress_callback=None)``. A tool that raised returns ``CallToolResult(is_error=True)``; a
  JSON-RPC error response raises ``mcp.MCPError`` (``.code``, ``.message``).
* progress: pass ``progress_callback=async def cb(progress: float, total: float | None,
  message: str | None)``; the SDK then sets ``params._meta.progressToken`` = the JSON-RPC
  request id and routes ``notifications/progress`` with that token to ``cb``.
* server-to-client requests: ``connect(..., sampling_callback=, elicitation_callback=,
  list_roots_callback=)``; each is ``async (context: ClientRequestContext, params) -> result |
  ErrorData``. Passing a callback is also what advertises the capability at initialize.
* session id: ``client.session_id`` (captured from the ``mcp-session-id`` response header by an
  httpx2 response hook: the SDK's ``streamable_http_client`` keeps it private).
* terminate: ``await client.terminate()`` sends ``DELETE`` with ``Mcp-Session-Id`` +
  ``MCP-Protocol-Version`` and returns the status (the SDK server answers 200, empty body).
  On exit ``connect()`` sends that DELETE itself unless already terminated or
  ``terminate_on_close=False``.
* cancel an in-flight call: cancel the task / anyio cancel scope awaiting ``call_tool`` (or
  let ``read_timeout_seconds`` expire, which raises ``MCPError(REQUEST_TIMEOUT=-32001)``).
  The SDK then (shielded) POSTs ``{"method": "notifications/cancelled", "params":
  {"requestId": <id>, "reason": "caller cancelled"}}`` (no ``id``; answered 202). In this era the
  original request POST is NOT aborted: its SSE stream stays open and receives the server's
  ``-32800 "Request cancelled"`` error, which the client drops; the HTTP connection only closes
  when the response ends or the transport exits.

Pitfalls:

* ``connect()`` owns anyio task groups/cancel scopes, so it must be entered and exited by the
  same task. pytest-asyncio runs an async *yield* fixture's setup and teardown in different
  tasks -> "RuntimeError: Attempted to exit cancel scope in a different task than it was
  entered in" at teardown. Use ``async with connect(...)`` in the test body, or
  ``connect_in_task(...)`` (same arguments) in fixtures.
* Exceptions escaping the ``async with connect(...)`` body would come out wrapped in an
  ``ExceptionGroup`` by the SDK's task groups; ``connect()`` unwraps a single leaf exception.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx2
from mcp import types
from mcp.client.session import (
    ClientSession,
    ElicitationFnT,
    ListRootsFnT,
    LoggingFnT,
    MessageHandlerFnT,
    SamplingFnT,
)
from mcp.client.streamable_http import streamable_http_client

__all__ = ["LEGACY_PROTOCOL_VERSION", "SdkClient", "connect", "connect_in_task"]

logger = logging.getLogger(__name__)

LEGACY_PROTOCOL_VERSION = "2025-11-25"


@dataclass
class _SessionIdCapture:
    session_id: str | None = None

    async def on_response(self, response: httpx2.Response) -> None:
        value = response.headers.get("mcp-session-id")
        if value and self.session_id is None:
            self.session_id = value


@dataclass
class SdkClient:
    """A connected, initialized official-SDK client session (2025-11-25 era)."""

    session: ClientSession
    http: httpx2.AsyncClient
    url: str
    initialize_result: types.InitializeResult
    _capture: _SessionIdCapture = field(repr=False)
    terminated: bool = False
    delete_status: int | None = None

    @property
    def session_id(self) -> str | None:
        """The ``Mcp-Session-Id`` the server issued (None for a stateless server)."""
        return self._capture.session_id

    @property
    def protocol_version(self) -> str | None:
        return self.session.protocol_version

    async def terminate(self) -> int | None:
        """Send ``DELETE <url>`` for this session; return the HTTP status (None if no session)."""
        if self.session_id is None or self.terminated:
            return None
        headers = {
            "accept": "application/json, text/event-stream",
            "mcp-session-id": self.session_id,
        }
        if self.protocol_version:
            headers["mcp-protocol-version"] = self.protocol_version
        response = await self.http.delete(self.url, headers=headers)
        self.terminated = True
        self.delete_status = response.status_code
        return response.status_code

    def __getattr__(self, name: str) -> Any:
        # Only reached for attributes not found normally: forward to the ClientSession
        # (list_tools, call_tool, send_ping, list_resources, ...).
        return getattr(self.session, name)


@contextlib.asynccontextmanager
async def connect(
    url: str,
    *,
    headers: dict[str, str] | None = None,
    sampling_callback: SamplingFnT | None = None,
    elicitation_callback: ElicitationFnT | None = None,
    list_roots_callback: ListRootsFnT | None = None,
    logging_callback: LoggingFnT | None = None,
    message_handler: MessageHandlerFnT | None = None,
    read_timeout_seconds: float | None = None,
    http_timeout: httpx2.Timeout | None = None,
    http_client: httpx2.AsyncClient | None = None,
    terminate_on_close: bool = True,
    client_info: types.Implementation | None = None,
    tasks: types.ClientTasksCapability | None = None,
) -> AsyncIterator[SdkClient]:
    """Connect the official SDK client to `url` (the full endpoint, e.g. ``.../mcp``).

    Runs the legacy initialize handshake (+ ``notifications/initialized``) and yields an
    :class:`SdkClient`. ``headers`` are sent on every HTTP request (the SDK's own
    ``Accept``/``Content-Type``/``Mcp-Session-Id``/``MCP-Protocol-Version`` win over them).
    ``http_client`` (optional, an ``httpx2.AsyncClient``, e.g. with event hooks for wire
    logging) is used as-is and NOT closed by ``connect()``; ``headers`` are merged into it and
    a response hook is appended to it to capture the session id.
    ``read_timeout_seconds`` is the default per-request timeout (None = wait forever).
    ``tasks`` is declared as the client's ``tasks`` capability at initialize (the SDK declares
    none of its own: it has no task client).
    """
    try:
        async with _connect(
            url,
            headers=headers,
            sampling_callback=sampling_callback,
            elicitation_callback=elicitation_callback,
            list_roots_callback=list_roots_callback,
            logging_callback=logging_callback,
            message_handler=message_handler,
            read_timeout_seconds=read_timeout_seconds,
            http_timeout=http_timeout,
            http_client=http_client,
            terminate_on_close=terminate_on_close,
            client_info=client_info,
            tasks=tasks,
        ) as client:
            yield client
    except BaseExceptionGroup as group:
        # The SDK's anyio task groups wrap whatever the `async with` body raised (an
        # AssertionError, an MCPError, ...) in an ExceptionGroup; hand back the single leaf so
        # `pytest.raises(X)` around the block and plain failure reports keep working.
        leaf = _single_leaf(group)
        if isinstance(leaf, Exception):
            raise leaf from None
        raise


def _single_leaf(exc: BaseException) -> BaseException | None:
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return None if isinstance(exc, BaseExceptionGroup) else exc


@contextlib.asynccontextmanager
async def _connect(
    url: str,
    *,
    headers: dict[str, str] | None,
    sampling_callback: SamplingFnT | None,
    elicitation_callback: ElicitationFnT | None,
    list_roots_callback: ListRootsFnT | None,
    logging_callback: LoggingFnT | None,
    message_handler: MessageHandlerFnT | None,
    read_timeout_seconds: float | None,
    http_timeout: httpx2.Timeout | None,
    http_client: httpx2.AsyncClient | None,
    terminate_on_close: bool,
    client_info: types.Implementation | None,
    tasks: types.ClientTasksCapability | None = None,
) -> AsyncIterator[SdkClient]:
    capture = _SessionIdCapture()
    async with contextlib.AsyncExitStack() as stack:
        if http_client is None:
            # the SDK's defaults (create_mcp_http_client): 30 s, 300 s read for SSE streams
            http = httpx2.AsyncClient(headers=headers, timeout=http_timeout or httpx2.Timeout(30, read=300))
            await stack.enter_async_context(http)
        else:
            http = http_client
            if headers:
                http.headers.update(headers)
        http.event_hooks["response"].append(capture.on_response)

        client: SdkClient | None = None

        async def delete_on_close() -> None:
            # Runs after the SDK transport has shut down (its POST/GET tasks are cancelled),
            # while the httpx2 client is still open.
            if client is not None and terminate_on_close and not client.terminated:
                try:
                    await client.terminate()
                except Exception:  # best effort, like the SDK's own terminate_session
                    logger.warning("session DELETE failed", exc_info=True)

        stack.push_async_callback(delete_on_close)

        # terminate_on_close=False: the DELETE is ours (see SdkClient.terminate), so an
        # explicit mid-test terminate() is not followed by a second DELETE from the SDK.
        read_stream, write_stream = await stack.enter_async_context(
            streamable_http_client(url, http_client=http, terminate_on_close=False)
        )
        session = await stack.enter_async_context(
            (ClientSession if tasks is None else _TaskClientSession.declaring(tasks))(
                read_stream,
                write_stream,
                read_timeout_seconds=read_timeout_seconds,
                sampling_callback=sampling_callback,
                elicitation_callback=elicitation_callback,
                list_roots_callback=list_roots_callback,
                logging_callback=logging_callback,
                message_handler=message_handler,
                client_info=client_info,
            )
        )
        init = await session.initialize()
        if init.protocol_version != LEGACY_PROTOCOL_VERSION:
            raise RuntimeError(f"server negotiated {init.protocol_version!r}, expected {LEGACY_PROTOCOL_VERSION!r}")
        client = SdkClient(session=session, http=http, url=url, initialize_result=init, _capture=capture)
        yield client


class _TaskClientSession(ClientSession):
    """The SDK's ClientSession, declaring a `tasks` capability at initialize."""

    tasks: types.ClientTasksCapability

    @classmethod
    def declaring(cls, tasks: types.ClientTasksCapability) -> type[_TaskClientSession]:
        return type("TaskClientSession", (cls,), {"tasks": tasks})

    def _build_capabilities(self, version: str) -> types.ClientCapabilities:
        return super()._build_capabilities(version).model_copy(update={"tasks": self.tasks})


@contextlib.asynccontextmanager
async def connect_in_task(url: str, **kwargs: Any) -> AsyncIterator[SdkClient]:
    """``connect()`` run inside a dedicated asyncio task; same arguments, same yielded client.

    For pytest-asyncio async *yield* fixtures, whose setup and teardown run in different
    tasks: entering ``connect()`` directly there fails at teardown with anyio's
    "Attempted to exit cancel scope in a different task than it was entered in". The
    client may be used (and its calls cancelled) from any task of the same event loop.
    Errors raised while the connection shuts down are re-raised on exit.
    """
    ready: asyncio.Future[SdkClient] = asyncio.get_running_loop().create_future()
    stop = asyncio.Event()

    async def hold() -> None:
        async with connect(url, **kwargs) as client:
            ready.set_result(client)
            await stop.wait()

    task = asyncio.create_task(hold(), name=f"sdk-client {url}")
    try:
        await asyncio.wait({ready, task}, return_when=asyncio.FIRST_COMPLETED)
        if not ready.done():
            task.result()  # connect() failed: re-raise its error
            raise RuntimeError("connect() returned without yielding a client")  # pragma: no cover
        yield ready.result()
    finally:
        stop.set()
        if not ready.done():
            ready.cancel()
        try:
            await asyncio.wait_for(asyncio.shield(task), 10)
        except TimeoutError:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
