"""An upstream that runs tools as MCP tasks (2025-11-25, SEP-1686) with ONE task store for
every client: the stateless server issue 38 names, which every caller of the gateway reaches
with the gateway's one credential, so only the gateway's binding keeps a task its creator's.

The official Python SDK (mcp 2.3) has the task types (`mcp.types.CreateTaskResult`, ...) but
no server support for tasks: its low-level `Server` registers no `tasks/*` handler, advertises
no `tasks` capability, and its runner checks a `tools/call` answer against CallToolResult
(a CreateTaskResult fails: "Handler returned an invalid result"). So this is the SDK's
low-level `Server` with the task methods registered through `add_request_handler`, served by
the SDK's own Streamable HTTP transport (stateless; JSON or SSE answers), and in front of it an
ASGI layer that answers a task-augmented `tools/call` itself, in the transport's answer mode
(`_creating`).

Tools:

* ``research(topic)``: as a task (``params.task``), answered at once with a CreateTaskResult
  (status ``working``); it completes with the text ``report on <topic>`` once ``release`` is
  set (set from the start unless ``held``). Called directly: the same text.
* ``echo(text)``: answered directly.

``tasks/get``, ``tasks/result`` (waits for the end, as the spec asks), ``tasks/cancel`` and
``tasks/list`` answer for any task id in the store, whoever asks: the bypass the gateway must
close. ``calls`` counts every request the upstream served, by method.

Status notifications (``notifications/tasks/status``): with ``notify`` set, a task's end sets
its status message to ``notify`` with the topic in place of ``{topic}`` and, in SSE mode,
``tasks/result`` is answered by the layer too: that status notification first, then the
result, on the request's stream; and a GET is answered with a server-to-client stream that
carries every notification put in ``pushed`` (a task's end puts its own there).
"""

from __future__ import annotations

import asyncio
import secrets
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import orjson
from mcp import types
from mcp.server.lowlevel import Server
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.exceptions import MCPError

from tests.e2e.upstreams import ASGIApp, Message, Receive, Scope, Send

TOOL = "research"
TTL_MS = 60_000

_TOOLS = [
    types.Tool(name=TOOL, description="Write a report on a topic (runs as a task).",
               input_schema={"type": "object", "properties": {"topic": {"type": "string"}},
                             "required": ["topic"]},
               execution=types.ToolExecution(task_support="optional")),
    types.Tool(name="echo", description="Echo the text back.",
               input_schema={"type": "object", "properties": {"text": {"type": "string"}},
                             "required": ["text"]}),
]


def _now() -> str:
    return datetime.now(UTC).isoformat()


@dataclass
class _Run:
    task: types.Task
    result: types.CallToolResult | None = None
    ended: asyncio.Event = field(default_factory=asyncio.Event)


class _TaskServer(Server[Any]):
    """The low-level server, advertising the tasks capability it serves."""

    def get_capabilities(self, *args: Any, **kwargs: Any) -> types.ServerCapabilities:
        caps = super().get_capabilities(*args, **kwargs)
        return caps.model_copy(update={"tasks": types.ServerTasksCapability(
            list=types.TasksListCapability(), cancel=types.TasksCancelCapability(),
            requests=types.ServerTasksRequestsCapability(
                tools=types.TasksToolsCapability(call=types.TasksCallCapability())))})


class TaskUpstream:
    """The server, its one task store, and what it was asked."""

    def __init__(self, *, held: bool = False, notify: str | None = None) -> None:
        self.notify = notify
        self.pushed: asyncio.Queue[dict[str, Any]] = asyncio.Queue()  # for the GET stream
        self.runs: dict[str, _Run] = {}
        self.calls: Counter[str] = Counter()
        self.release = asyncio.Event()
        if not held:
            self.release.set()
        self._background: set[asyncio.Task[None]] = set()
        server = self.server = _TaskServer("task-upstream", version="1.0.0",
                                           on_list_tools=self._list_tools,
                                           on_call_tool=self._call_tool)
        server.add_request_handler("tasks/get", types.GetTaskRequestParams, self._get)
        server.add_request_handler("tasks/result", types.GetTaskPayloadRequestParams,
                                   self._result)
        server.add_request_handler("tasks/cancel", types.CancelTaskRequestParams, self._cancel)
        server.add_request_handler("tasks/list", types.PaginatedRequestParams, self._list)

    def app(self, *, json: bool) -> ASGIApp:
        """Stateless, JSON answers (`json`) or SSE ones; served once."""
        sdk = self.server.streamable_http_app(
            streamable_http_path="/mcp", json_response=json, stateless_http=True,
            transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False))
        return self._creating(sdk, json)

    def _creating(self, sdk: ASGIApp, json: bool) -> ASGIApp:
        """`sdk`, with a task-augmented tools/call answered here (a CreateTaskResult, which
        the SDK's runner would refuse to send), as JSON or as one SSE event."""

        async def app(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] == "http" and scope["method"] == "GET" and self.notify:
                await self._listen(send)
                return
            if scope["type"] != "http" or scope["method"] != "POST":
                await sdk(scope, receive, send)
                return
            chunks: list[bytes] = []
            while True:
                message = await receive()
                chunks.append(message.get("body", b""))
                if not message.get("more_body"):
                    break
            body = b"".join(chunks)
            request = _task_call(body)
            awaited = None if json or not self.notify else _result_call(body)
            if awaited is not None:
                await self._result_stream(awaited, send)
                return
            if request is None:
                replayed = False

                async def replay() -> Message:
                    nonlocal replayed
                    if not replayed:
                        replayed = True
                        return {"type": "http.request", "body": body, "more_body": False}
                    return await receive()

                await sdk(scope, replay, send)
                return
            answer = orjson.dumps({"jsonrpc": "2.0", "id": request["id"],
                                   "result": self._create(request["params"])})
            if json:
                kind, payload = b"application/json", answer
            else:
                kind, payload = b"text/event-stream", b"event: message\r\ndata: " + answer + \
                    b"\r\n\r\n"
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", kind)]})
            await send({"type": "http.response.body", "body": payload})

        return app

    async def _result_stream(self, request: dict[str, Any], send: Send) -> None:
        """A tasks/result in SSE mode with `notify`: the task's status notification, then
        its result (or the unknown task's error), on the request's stream."""
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")]})
        run = self.runs.get(str((request.get("params") or {}).get("taskId")))
        self.calls["tasks/result"] += 1
        if run is None:
            answer: dict[str, Any] = {"error": {"code": types.INVALID_PARAMS,
                                                "message": "Failed to retrieve task: Task not found"}}
        else:
            await run.ended.wait()
            await send({"type": "http.response.body", "body": _event(_status(run.task)),
                        "more_body": True})
            answer = {"result": run.result.model_dump(by_alias=True, mode="json",
                                                      exclude_none=True)} if run.result else {
                "error": {"code": types.INVALID_PARAMS, "message": "cancelled"}}
        await send({"type": "http.response.body",
                    "body": _event({"jsonrpc": "2.0", "id": request["id"], **answer})})

    async def _listen(self, send: Send) -> None:
        """The server-to-client stream: each notification put in `pushed`, until closed."""
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")]})
        await send({"type": "http.response.body", "body": b": open\n\n", "more_body": True})
        while True:
            note = await self.pushed.get()
            await send({"type": "http.response.body", "body": _event(note), "more_body": True})

    async def _list_tools(self, ctx: Any, params: Any) -> types.ListToolsResult:
        self.calls["tools/list"] += 1
        return types.ListToolsResult(tools=_TOOLS)

    async def _call_tool(self, ctx: Any, params: types.CallToolRequestParams) -> Any:
        self.calls["tools/call"] += 1
        arguments = params.arguments or {}
        if params.name == "echo":
            return _text(str(arguments.get("text", "")))
        if params.name != TOOL:
            raise MCPError(types.INVALID_PARAMS, f"Unknown tool: {params.name}")
        return _text(f"report on {arguments.get('topic', '')}")

    def _create(self, params: dict[str, Any]) -> dict[str, Any]:
        """A task-augmented tools/call of `research`: the task, working."""
        self.calls["tools/call"] += 1
        arguments = params.get("arguments") or {}
        report = f"report on {arguments.get('topic', '')}"
        ttl = params["task"].get("ttl")
        now = _now()
        run = _Run(types.Task(task_id=secrets.token_hex(8), status="working", created_at=now,
                              last_updated_at=now, ttl=ttl if isinstance(ttl, int) else TTL_MS,
                              poll_interval=50, status_message=f"researching {report}"))
        self.runs[run.task.task_id] = run
        worker = asyncio.create_task(self._work(run, report))
        self._background.add(worker)
        worker.add_done_callback(self._background.discard)
        return types.CreateTaskResult(task=run.task).model_dump(by_alias=True, mode="json",
                                                                exclude_none=True)

    async def _work(self, run: _Run, report: str) -> None:
        await self.release.wait()
        if run.task.status == "working":
            run.result = _text(report)
            update: dict[str, Any] = {"status": "completed", "last_updated_at": _now()}
            if self.notify:
                update["status_message"] = self.notify.replace("{topic}", report[10:])
            run.task = run.task.model_copy(update=update)
            if self.notify:
                self.pushed.put_nowait(_status(run.task))
        run.ended.set()

    def _run(self, task_id: str) -> _Run:
        run = self.runs.get(task_id)
        if run is None:
            raise MCPError(types.INVALID_PARAMS, "Failed to retrieve task: Task not found")
        return run

    async def _get(self, ctx: Any, params: types.GetTaskRequestParams) -> types.GetTaskResult:
        self.calls["tasks/get"] += 1
        return types.GetTaskResult(**self._run(params.task_id).task.model_dump())

    async def _result(self, ctx: Any, params: types.GetTaskPayloadRequestParams
                      ) -> dict[str, Any]:
        self.calls["tasks/result"] += 1
        run = self._run(params.task_id)
        await run.ended.wait()
        if run.result is None:
            raise MCPError(types.INVALID_PARAMS, f"Task {params.task_id} was cancelled")
        return run.result.model_dump(by_alias=True, mode="json", exclude_none=True)

    async def _cancel(self, ctx: Any, params: types.CancelTaskRequestParams
                      ) -> types.CancelTaskResult:
        self.calls["tasks/cancel"] += 1
        run = self._run(params.task_id)
        if run.task.status == "working":
            run.task = run.task.model_copy(update={"status": "cancelled",
                                                   "last_updated_at": _now()})
            run.ended.set()
        return types.CancelTaskResult(**run.task.model_dump())

    async def _list(self, ctx: Any, params: Any) -> types.ListTasksResult:
        self.calls["tasks/list"] += 1
        return types.ListTasksResult(tasks=[run.task for run in self.runs.values()])


def _task_call(body: bytes) -> dict[str, Any] | None:
    """The request, when `body` is a task-augmented tools/call of `research`."""
    try:
        message = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    params = message.get("params") if isinstance(message, dict) else None
    if message.get("method") == "tools/call" and isinstance(params, dict) \
            and params.get("name") == TOOL and isinstance(params.get("task"), dict):
        return dict(message)
    return None


def _result_call(body: bytes) -> dict[str, Any] | None:
    """The request, when `body` is a tasks/result."""
    try:
        message = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    if isinstance(message, dict) and message.get("method") == "tasks/result":
        return dict(message)
    return None


def _status(task: types.Task) -> dict[str, Any]:
    """The task's status notification."""
    return {"jsonrpc": "2.0", "method": "notifications/tasks/status",
            "params": task.model_dump(by_alias=True, mode="json", exclude_none=True)}


def _event(message: dict[str, Any]) -> bytes:
    return b"event: message\r\ndata: " + orjson.dumps(message) + b"\r\n\r\n"


def _text(text: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)])
