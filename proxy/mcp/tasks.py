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
- `notifications/tasks/status` (`noticer`, on a task's request's stream; `listener`, on the
  session's GET stream): relayed only for a task of the caller's that the stream concerns (on
  a GET stream: one it owned when the stream opened, with a tool it may still use, or one it
  created through this process since), its status message read by the result rules of the
  task's tool as a tasks/get's is; any other task's is left out;
- the end of a task (a terminal status seen in any answer or status notification): one audit
  record, whichever replica sees it first (`notifications/tasks/status`, the task's tool, its
  status and its duration since creation);
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
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import orjson

from proxy.audit import AuditRecord, AuditSink
from proxy.audit.record import Status
from proxy.chain import CallContext
from proxy.errors import GatewayError, InvalidParams
from proxy.jsonrpc import McpMessage
from proxy.mcp import eras
from proxy.state.tasks import TaskBinding, TaskStore, ttl_of

if TYPE_CHECKING:
    from proxy.auth.principal import Principal
    from proxy.chain import Chain, Notice, Rewrite, Verdict
    from proxy.mcp.exchange import Exchange
    from proxy.state import Session

log = logging.getLogger("tollhouse.tasks")

NAMED = frozenset({"tasks/get", "tasks/result", "tasks/cancel"})  # one task, by its id
METHODS = NAMED | {"tasks/list"}
UNKNOWN = "Failed to retrieve task: Task not found"
# a task's terminal status -> the completion record's status
ENDED: dict[str, Status] = {"completed": "ok", "failed": "error", "cancelled": "cancelled"}
STATUS = "notifications/tasks/status"  # a task's status notification
COMPLETION = STATUS  # the method of a task's completion record
EXTENSION = "io.modelcontextprotocol/tasks"  # the 2026-07-28 tasks extension's identifier
MEMBER_SEP = "/"  # a virtual endpoint's task id: <member>/<the member's own id>
# the policies that decide whether a caller may use a tool at all: a task of a tool one of
# them hides is left out of the caller's tasks/list (`usable`)
HIDING = ("access", "cedar", "guardrails")

RECENT = 10_000  # the tasks created through this process a GET stream's reader knows of
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
        # the tasks created through this process, (endpoint, owner, task id) -> tool: what a
        # GET stream opened before one was created knows of it (`listener`)
        self._recent: OrderedDict[tuple[str, str, str], str] = OrderedDict()

    async def listener(self, endpoint: str, principal: Principal, chain: Chain,
                       usable: Callable[[CallContext], Awaitable[None]]) -> Notice:
        """What reads a GET stream's notifications on `endpoint` for `principal`: a
        `notifications/tasks/status` of one of the caller's tasks whose tool it may still use
        (those it has when the stream opens, and those created through this process since)
        has its status message read by the result rules of the task's tool, and a terminal
        status recorded as the task's end; one of any other task is left out. Any other
        notification passes unread."""
        ctx = CallContext(principal, endpoint, "")
        try:
            ctx.task = TaskCall(owned=await self.store.owned(endpoint, principal.key))
            await usable(ctx)  # the route's: by its own names (a virtual endpoint's)
        except GatewayError as exc:  # the store is out of reach: only tasks created since
            log.warning("%s: a GET stream's tasks could not be read: %s", endpoint, exc)
            ctx.task = TaskCall()
        owned = ctx.task.owned
        readers: dict[str, Rewrite | None] = {}
        recent = self._recent

        def heard(message: dict[str, Any]) -> Verdict:
            if message.get("method") != STATUS:
                return "kept"
            params = message.get("params")
            task_id = params.get("taskId") if isinstance(params, dict) else None
            if not isinstance(params, dict) or not isinstance(task_id, str):
                return "dropped"
            tool = owned.get(task_id) or recent.get((endpoint, principal.key, task_id))
            if tool is None:
                return "dropped"  # not a task of this caller's (as far as is known here)
            if tool not in readers:
                readers[tool] = chain.rewriter(_as_get(tool), ctx)
            reader = readers[tool]
            changed = reader is not None and reader(params)
            self._seen(endpoint, task_id, params)
            return "changed" if changed else "kept"

        return heard

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

    def noticer(self, endpoint: str, msg: McpMessage, ctx: CallContext, chain: Chain,
                notice: Notice | None) -> Notice | None:
        """What reads the notifications on the stream of a task's request on `endpoint` (a
        task-run call, once its answer has named the task; a tasks/get, tasks/result or
        tasks/cancel; a tasks/list): a `notifications/tasks/status` of a task of the caller's
        that this call concerns has its status message read by the result rules of the
        task's tool (as a tasks/get's is: redacted, or replaced by what a person reads of the
        refusal; the status itself always reaches the client), and a terminal status is
        recorded as the task's end; one of any other task is left out (never relayed); any
        other notification is `notice`'s. On any other call's stream a task's status
        notification is left out (a stdio upstream sends one, tied to no request, on whichever
        session has a call in flight: it may be another caller's task), and the rest is
        `notice`'s. On a virtual endpoint `ctx` is the member's, and its notifications name
        the member's own ids."""
        if not concerned(msg):  # no task of the caller's is this call's to hear of
            return _no_status if notice is None else _without_status(notice)
        member = ctx.endpoint if ctx.endpoint != endpoint else None
        readers: dict[str, Rewrite | None] = {}

        def heard(message: dict[str, Any]) -> Verdict:
            if message.get("method") != STATUS:
                return notice(message) if notice is not None else "kept"
            params = message.get("params")
            task_id = params.get("taskId") if isinstance(params, dict) else None
            tool = _tool_of(ctx.task, task_id)
            if tool is None or not isinstance(params, dict) or not isinstance(task_id, str):
                return "dropped"  # not a task of this caller's that this call concerns
            if tool not in readers:
                readers[tool] = chain.rewriter(_as_get(tool), ctx)
            reader = readers[tool]
            changed = reader is not None and reader(params)
            self._seen(endpoint, member_task(member, task_id) if member else task_id, params)
            return "changed" if changed else "kept"

        return heard

    def _creating(self, endpoint: str, msg: McpMessage, ctx: CallContext, exchange: Exchange
                  ) -> Rewrite:
        tool = msg.tool or ""
        principal = ctx.principal
        # a virtual endpoint's member (its context's), whose id the client sees prefixed
        member = ctx.endpoint if ctx.endpoint != endpoint else None
        prefix = member_task(member, "") if member is not None else ""
        store, recent = self.store, self._recent

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
            ctx.task = TaskCall(task_id, binding)  # its status notifications, on this stream
            recent[(endpoint, principal.key, task_id)] = tool  # and on a GET stream
            while len(recent) > RECENT:
                recent.popitem(last=False)
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


def _no_status(message: dict[str, Any]) -> Verdict:
    """A non-task call's notifications, when no policy reads them: a task's status left out."""
    return "dropped" if message.get("method") == STATUS else "kept"


def _without_status(notice: Notice) -> Notice:
    """A non-task call's notifications, as `notice` reads them, a task's status left out."""

    def heard(message: dict[str, Any]) -> Verdict:
        return "dropped" if message.get("method") == STATUS else notice(message)

    return heard


def _tool_of(task: TaskCall | None, task_id: object) -> str | None:
    """The tool of the task `task_id` (as its upstream names it: on a virtual endpoint, the
    member's own id) when it is the task a call names (or created) or one of the caller's
    own it lists; None for any other."""
    if task is None or not isinstance(task_id, str):
        return None
    binding = task.binding
    if binding is not None:
        return binding.tool if task_id == (binding.upstream_id or task.task_id) else None
    return task.owned.get(task_id)


def _as_get(tool: str) -> McpMessage:
    """A tasks/get of a task of `tool`: what a listed task's status message is read as."""
    return McpMessage("request", None, "tasks/get", {}, b"", task_tool=tool)
