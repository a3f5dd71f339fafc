"""MCP tasks (2025-11-25, SEP-1686) through the gateway, held to the same policies as the tool
they run.

A `tools/call` with `params.task` is answered with a CreateTaskResult; its result comes later,
through `tasks/result`, and its state through `tasks/get`, `tasks/list`, `tasks/cancel` and
`notifications/tasks/status`. Every one of those is decided here and by the policy chain as the
tool itself is:

- creation: the tools/call goes through the chain as any call does (access, profiles, Cedar,
  rate limits, guardrails on its arguments, metering: counted once, here); the task id in its
  answer is bound to the endpoint and the caller (`proxy.state.tasks`, shared by every
  replica) before the answer goes out (`Exchange.before_write`), and the audit record of the
  call names the task (its note, and the usage event's `task`);
- `tasks/get`, `tasks/result`, `tasks/cancel` (`view`): a task id not bound to this caller on
  this endpoint is answered as an unknown task (-32602), whoever created it; a bound one is
  given to the chain as a request of the task's tool (`McpMessage.task_tool`), so the access
  profile, Cedar and the guardrails decide it by that tool, and the result guardrails read
  `tasks/result` as they read the tool's direct answer (and a status message as a result);
- `tasks/list` (`view`, `usable`, `rewriter`): only the caller's own tasks are shown, and of those only
  the ones whose tool the caller may still use (`usable`: a plain upstream's check, proxy.mcp.
  forward), their status messages read by the rules of each task's tool;
- the end of a task (a terminal status seen in any answer): one audit record, whichever
  replica sees it first (`notifications/tasks/status`, the task's tool, its status and its
  duration since creation);
- a client that did not declare task support (`declares_tasks`: the `tasks` capability of its
  initialize, or of a 2026-07-28 request's envelope) is never handed a task: its task-run call
  has `params.task` taken out and runs directly (`admit`), as the spec has a receiver that
  did not negotiate task support process the request;
- on a virtual endpoint a task id is the member's, prefixed with the member (`member_task`:
  `<member>/<id>`); the binding keeps the member and its own id, and proxy/virtual routes the
  task's requests by it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import orjson

from proxy.audit import AuditRecord, AuditSink
from proxy.audit.record import Status
from proxy.errors import GatewayError, InvalidParams
from proxy.jsonrpc import McpMessage
from proxy.mcp import eras
from proxy.state.tasks import TaskBinding, TaskStore, ttl_of

if TYPE_CHECKING:
    from proxy.chain import CallContext, Chain, Rewrite
    from proxy.mcp.exchange import Exchange
    from proxy.state import Session

log = logging.getLogger("tollhouse.tasks")

NAMED = frozenset({"tasks/get", "tasks/result", "tasks/cancel"})  # one task, by its id
METHODS = NAMED | {"tasks/list"}
UNKNOWN = "Failed to retrieve task: Task not found"
# a task's terminal status -> the completion record's status
ENDED: dict[str, Status] = {"completed": "ok", "failed": "error", "cancelled": "cancelled"}
COMPLETION = "notifications/tasks/status"  # the method of a task's completion record
EXTENSION = "io.modelcontextprotocol/tasks"  # the 2026-07-28 tasks extension's identifier
MEMBER_SEP = "/"  # a virtual endpoint's task id: <member>/<the member's own id>
# the policies that decide whether a caller may use a tool at all: a task of a tool one of
# them hides is left out of the caller's tasks/list (`usable`)
HIDING = ("access", "cedar", "guardrails")

Spawn = Callable[[Coroutine[Any, Any, None]], None]


@dataclass(slots=True)
class TaskCall:
    """What the gateway knows of a tasks/* request once `Tasks.view` has checked it: the
    task (one named) and its binding, or the caller's own tasks (a list: id -> tool)."""

    task_id: str | None = None
    binding: TaskBinding | None = None
    owned: dict[str, str] = field(default_factory=dict)


def unknown_task() -> InvalidParams:
    """The answer to a task id this caller did not create here (or that no one did): the
    same whoever created it, so that it reveals nothing."""
    return InvalidParams(UNKNOWN)


def task_requested(msg: McpMessage) -> bool:
    """A tools/call the client asks to run as a task."""
    return msg.method == "tools/call" and isinstance((msg.params or {}).get("task"), dict)


def concerned(msg: McpMessage) -> bool:
    """A request `Tasks.admit` checks: a tasks/* request, or a task-run tools/call."""
    return msg.kind == "request" and (msg.method in METHODS or task_requested(msg))


def declares_tasks(capabilities: object) -> bool:
    """Whether a client's capabilities declare task support: the 2025-11-25 `tasks`
    capability, or the 2026-07-28 tasks extension."""
    if not isinstance(capabilities, dict):
        return False
    extensions = capabilities.get("extensions")
    return isinstance(capabilities.get("tasks"), dict) or (
        isinstance(extensions, dict) and isinstance(extensions.get(EXTENSION), dict))


def declared(msg: McpMessage, session: Session | None, era: str) -> object:
    """What the client declared: at initialize (its session), or in a 2026-07-28 request's
    envelope."""
    if era == "modern":
        meta = (msg.params or {}).get("_meta")
        return meta.get(eras.CLIENT_CAPS) if isinstance(meta, dict) else None
    return session.capabilities if session is not None else None


def run_directly(msg: McpMessage) -> McpMessage:
    """The task-run call without its `params.task`: answered directly."""
    params = {k: v for k, v in (msg.params or {}).items() if k != "task"}
    body = orjson.dumps({"jsonrpc": "2.0", "id": msg.id, "method": msg.method,
                         "params": params})
    return McpMessage(msg.kind, msg.id, msg.method, params, body)


def member_task(member: str, task_id: str) -> str:
    """A member's task id as a virtual endpoint shows it."""
    return f"{member}{MEMBER_SEP}{task_id}"


class Tasks:
    def __init__(self, store: TaskStore, audit: AuditSink, spawn: Spawn) -> None:
        self.store = store
        self._audit = audit
        self._spawn = spawn

    async def admit(self, endpoint: str, msg: McpMessage, ctx: CallContext,
                    exchange: Exchange, session: Session | None) -> McpMessage:
        """The message the chain decides: a task-run call of a client that did not declare
        task support, without its task (run directly, `run_directly`); a tasks/* request
        checked against the task's binding (`view`); any other as it came."""
        if task_requested(msg):
            if declares_tasks(declared(msg, session, ctx.era)):
                return msg
            ctx.audit_note = "; ".join(filter(None, (
                ctx.audit_note, "task support not declared by the client: run directly")))
            return run_directly(msg)
        if msg.method in METHODS:
            return await self.view(endpoint, msg, ctx, exchange)
        return msg

    async def view(self, endpoint: str, msg: McpMessage, ctx: CallContext,
                   exchange: Exchange) -> McpMessage:
        """The message as the chain decides it: a tasks/get, tasks/result or tasks/cancel of
        a task this caller created here, as a request of its tool (`task_tool`); an unknown
        task raised otherwise. A tasks/list goes as it came, the caller's tasks kept for its
        answer (`ctx.task`)."""
        if msg.method == "tasks/list":
            ctx.task = TaskCall(owned=await self.store.owned(endpoint, ctx.principal.key))
            return msg
        task_id = (msg.params or {}).get("taskId")
        if not isinstance(task_id, str) or not task_id:
            raise InvalidParams("Invalid params: taskId must be a non-empty string")
        binding = await self.store.binding(endpoint, task_id)
        if binding is None or binding.owner != ctx.principal.key:
            raise unknown_task()
        ctx.task = TaskCall(task_id, binding)
        exchange.record.tool = binding.tool  # its record names the tool, refused or not
        return replace(msg, task_tool=binding.tool)

    def rewriter(self, endpoint: str, msg: McpMessage, ctx: CallContext, exchange: Exchange,
                 chain: Chain) -> Rewrite | None:
        """What the gateway does to the answer of a task's request on `endpoint` (after the
        policies): a created task bound, a list kept to the caller's own, an end recorded;
        None for a call that is none of these. On a virtual endpoint `ctx` is the member's."""
        if task_requested(msg):
            return self._creating(endpoint, msg, ctx, exchange)
        task = ctx.task
        if task is None or msg.method not in METHODS:
            return None
        if msg.method == "tasks/list":
            return self._listing(endpoint, ctx, task, chain)
        return self._reading(endpoint, msg, task)

    def _creating(self, endpoint: str, msg: McpMessage, ctx: CallContext, exchange: Exchange
                  ) -> Rewrite:
        tool = msg.tool or ""
        principal = ctx.principal
        # a virtual endpoint's member (its context's), whose id the client sees prefixed
        member = ctx.endpoint if ctx.endpoint != endpoint else None
        prefix = member_task(member, "") if member is not None else ""
        store = self.store

        def created(result: dict[str, Any]) -> bool:
            task = result.get("task")
            task_id = task.get("taskId") if isinstance(task, dict) else None
            if not isinstance(task, dict) or not isinstance(task_id, str) or not task_id \
                    or not task_id.startswith(prefix):
                return False  # answered directly (an upstream without tasks): nothing to bind
            binding = TaskBinding(principal.key, principal.subject, tool, time.time(),
                                  member, task_id[len(prefix):] if member else None)
            ttl = ttl_of(task)
            exchange.tasked(task_id, lambda: store.bind(endpoint, task_id, binding, ttl))
            self._seen(endpoint, task_id, task)
            return False

        return created

    def _listing(self, endpoint: str, ctx: CallContext, task: TaskCall, chain: Chain
                 ) -> Rewrite:
        owned = task.owned

        def listed(result: dict[str, Any]) -> bool:
            tasks = result.get("tasks")
            if not isinstance(tasks, list):
                return False
            kept = [t for t in tasks if isinstance(t, dict) and t.get("taskId") in owned]
            readers: dict[str, Rewrite | None] = {}
            for entry in kept:
                task_id = entry["taskId"]
                tool = owned[task_id]
                if tool not in readers:  # the status message, read as that tool's result is
                    readers[tool] = chain.rewriter(_as_get(tool), ctx)
                reader = readers[tool]
                if reader is not None and "statusMessage" in entry:
                    reader(entry)
                self._seen(endpoint, task_id, entry)
            result["tasks"] = kept
            return True

        return listed

    def _reading(self, endpoint: str, msg: McpMessage, task: TaskCall) -> Rewrite:
        task_id = task.task_id or ""
        method = msg.method

        def read(result: dict[str, Any]) -> bool:
            if method == "tasks/result":  # the task's own result: it has ended
                self._ended(endpoint, task_id, "failed" if result.get("isError") else
                            "completed")
            else:
                self._seen(endpoint, task_id, result)
            return False

        return read

    def _seen(self, endpoint: str, task_id: Any, task: dict[str, Any]) -> None:
        status = task.get("status")
        if isinstance(task_id, str) and isinstance(status, str) and status in ENDED:
            self._ended(endpoint, task_id, status)

    def _ended(self, endpoint: str, task_id: str, status: str) -> None:
        self._spawn(self._record_end(endpoint, task_id, status))

    async def _record_end(self, endpoint: str, task_id: str, status: str) -> None:
        """The task's one completion record: written by whichever replica marks its end
        first."""
        try:
            binding = await self.store.finish(endpoint, task_id)
        except GatewayError as exc:  # the store is out of reach: the record is not written
            log.warning("%s: the end of a task could not be recorded: %s", endpoint, exc)
            return
        if binding is None:
            return
        record = AuditRecord(endpoint=endpoint, method=COMPLETION, principal=binding.subject,
                             tool=binding.tool, status=ENDED[status],
                             note=f"task {task_id[:100]} {status}")
        record.duration_ms = max(0.0, (time.time() - binding.created_at) * 1000)
        record.accepted = True
        self._audit.emit(record)


async def usable(ctx: CallContext, chain: Chain) -> None:
    """A tasks/list's tasks (`ctx.task.owned`, id -> tool) kept to those whose tool the
    caller may still use: a tasks/get of one is decided by the policies that hide a tool
    (`HIDING`), once per tool. A task whose tool was hidden from the caller since it was
    created (its group left, a Cedar policy added, the tool screened out) is left out of its
    tasks/list, as its tasks/get is refused."""
    task = ctx.task
    owned = task.owned if task is not None else {}
    kept: dict[str, bool] = {}
    for tool in set(owned.values()):
        try:
            await chain.run(_as_get(tool), ctx, only=HIDING)
            kept[tool] = True
        except GatewayError:
            kept[tool] = False
    if task is not None:
        task.owned = {task_id: tool for task_id, tool in owned.items() if kept[tool]}


def _as_get(tool: str) -> McpMessage:
    """A tasks/get of a task of `tool`: what a listed task's status message is read as."""
    return McpMessage("request", None, "tasks/get", {}, b"", task_tool=tool)
