"""MCP tasks (2025-11-25) through a virtual endpoint: each task lives on the member that ran its
tool, and the client sees it under a task id prefixed with that member (`<member>/<id>`,
`proxy.mcp.tasks.member_task`).

The task's binding (proxy/mcp/tasks.py, made when the CreateTaskResult goes out) keeps the
member and its own id, so a `tasks/get`, `tasks/result` or `tasks/cancel` goes to that member
with that id (`check`, then `target`), whatever the id says: an id no binding of this caller
names is an unknown task, never parsed for a member. The policies decide it as the task's
tool is decided on this endpoint: the endpoint's access rules on the tool's exposed name,
then the whole chain with the member's view on the member's own name. What the member answers
is shown with the endpoint's ids (`shown`): the task's id, the related-task `_meta` of its
result, and the resource URIs of a `tasks/result` as in the tool's direct answer
(proxy/virtual/uris.py). `tasks/list` asks the members the caller has tasks on (`Listing`),
merged and paged with one sealed cursor, each task under its endpoint id; the spine keeps the
caller's own, and of those only the ones whose tool the caller may still use (`usable`,
decided as their tasks/get is). The endpoint's initialize advertises the `tasks` capability its members offer
(proxy/virtual/lists.py, `tasks_offered`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import orjson

from proxy.chain import CallContext, Chain, Rewrite
from proxy.errors import GatewayError, HiddenTool, InternalError
from proxy.jsonrpc import McpMessage
from proxy.mcp import names, tasks
from proxy.mcp.legs import then
from proxy.state import Session
from proxy.virtual import naming, uris
from proxy.virtual.cursor import Cursors
from proxy.virtual.fanout import FanOut
from proxy.virtual.lists import request
from proxy.virtual.members import Members, context
from proxy.virtual.route import VirtualRoute

RELATED = "io.modelcontextprotocol/related-task"  # a result's or notice's `_meta` key
LIST = "tasks/list"


def exposed_tool(route: VirtualRoute, member: str, tool: str) -> str:
    """The name the endpoint shows a member's tool under (its alias, else namespaced)."""
    return route.aliased.get((member, tool)) or naming.exposed(member, tool, route.separator)


async def check(route: VirtualRoute, members: Members, chain: Chain, msg: McpMessage,
                ctx: CallContext) -> CallContext:
    """A tasks/get, tasks/result or tasks/cancel of a task `Tasks.view` found bound to this
    caller: the endpoint's access rules on the tool's exposed name, then the chain with the
    member's view, on the member's message (the member's own task id); the member's context,
    carrying the task, is what the call goes on with."""
    task = ctx.task
    binding = task.binding if task is not None else None
    if binding is None or binding.member is None or binding.upstream_id is None:
        raise tasks.unknown_task()  # bound on a plain endpoint of the same name, or in an
        # older shape: nothing here to route it by
    if binding.member not in route.members or not members.served(binding.member):
        raise tasks.unknown_task()  # its member has left the endpoint: the task with it
    exposed = exposed_tool(route, binding.member, binding.tool)
    try:
        await chain.run(dataclasses.replace(msg, task_tool=exposed), ctx, only=("access",))
        mctx = context(ctx, members.registered(binding.member))
        mctx.task = task
        mmsg = member_message(msg, binding.upstream_id, binding.tool)
        await chain.run(mmsg, mctx)
    except HiddenTool as exc:  # as the caller knows the tool: by its exposed name
        out = HiddenTool(exc.reason, exposed)
        out.detail = names.unknown("tool", exposed)
        out.decided_by = exc.decided_by
        raise out from None
    mctx.message = mctx.message or mmsg
    note = f"virtual: member {binding.member}, task {binding.upstream_id[:100]}"
    mctx.audit_note = f"{mctx.audit_note}; {note}" if mctx.audit_note else note
    return mctx


async def usable(route: VirtualRoute, members: Members, chain: Chain, ctx: CallContext
                 ) -> None:
    """A tasks/list's tasks (`ctx.task.owned`: the endpoint's id -> the member's own tool)
    kept to those the caller may still use, each decided as a tasks/get of it is (`check`:
    the endpoint's access rules on the tool's exposed name, then the policies that hide a tool
    with the member's view), once per member and tool; a task whose member has left the
    endpoint, or whose tool was hidden from the caller since it was created (its tool profile
    changed, a Cedar policy added, the tool screened out), is left out of the merged list, as
    its tasks/get is refused."""
    task = ctx.task
    if task is None or not task.owned:
        return
    decided: dict[tuple[str, str], bool] = {}
    kept: dict[str, str] = {}
    for task_id, tool in task.owned.items():
        member = owner(route, task_id)
        if member is None:
            continue
        if (member, tool) not in decided:
            decided[(member, tool)] = await _may_use(route, members, chain, ctx, member, tool)
        if decided[(member, tool)]:
            kept[task_id] = tool
    task.owned = kept


def owner(route: VirtualRoute, task_id: str) -> str | None:
    """The member of the endpoint whose task `task_id` (as the endpoint shows it) is."""
    found = [m for m in route.members if task_id.startswith(tasks.member_task(m, ""))]
    return max(found, key=len) if found else None


async def _may_use(route: VirtualRoute, members: Members, chain: Chain, ctx: CallContext,
                   member: str, tool: str) -> bool:
    if not members.served(member):
        return False
    probe = McpMessage("request", None, "tasks/get", {}, b"",
                       task_tool=exposed_tool(route, member, tool))
    try:
        await chain.run(probe, ctx, only=("access",))
        await chain.run(dataclasses.replace(probe, task_tool=tool),
                        context(ctx, members.registered(member)), only=tasks.HIDING)
    except GatewayError:
        return False
    return True


def member_message(msg: McpMessage, upstream_id: str, tool: str) -> McpMessage:
    """The request as the member receives it: the member's own task id."""
    params = {**(msg.params or {}), "taskId": upstream_id}
    body = orjson.dumps({"jsonrpc": "2.0", "id": msg.id, "method": msg.method,
                         "params": params})
    return McpMessage(msg.kind, msg.id, msg.method, params, body, task_tool=tool)


def target(route: VirtualRoute, ctx: CallContext) -> str:
    """The member `check` routed a task's request to."""
    binding = ctx.task.binding if ctx.task is not None else None
    if binding is None or binding.member is None or ctx.endpoint != binding.member \
            or binding.member not in route.members:
        raise InternalError(f"a task's request for /mcp/{route.name} was not checked")
    return binding.member


def shown(member: str, method: str | None, params: Mapping[str, Any] | None
          ) -> Rewrite | None:
    """What the client is shown of a member's answer about a task: the endpoint's task id
    (a created task's, a task's state, a result's related task), and a task's result with
    its URIs as the tool's direct answer shows them."""
    if method == "tools/call":
        if isinstance((params or {}).get("task"), dict):
            return then(uris.shown(member, method), lambda r: _created(member, r))
        return uris.shown(member, method)
    if method == "tasks/result":
        return then(uris.shown(member, "tools/call"), lambda r: _related(member, r))
    if method in ("tasks/get", "tasks/cancel"):
        return lambda result: _task(member, result)
    return uris.shown(member, method)


def notice(member: str, params: dict[str, Any]) -> bool:
    """A member's `notifications/tasks/status`, its task under the endpoint's id."""
    changed = _task(member, params)
    return _related(member, params) or changed


def _created(member: str, result: dict[str, Any]) -> bool:
    task = result.get("task")
    return isinstance(task, dict) and _task(member, task)


def _task(member: str, task: dict[str, Any]) -> bool:
    task_id = task.get("taskId")
    if not isinstance(task_id, str):
        return False
    task["taskId"] = tasks.member_task(member, task_id)
    return True


def _related(member: str, result: dict[str, Any]) -> bool:
    meta = result.get("_meta")
    related = meta.get(RELATED) if isinstance(meta, dict) else None
    return isinstance(related, dict) and _task(member, related)


class Listing:
    """`tasks/list` on a virtual endpoint: the members this caller has tasks on, asked at
    once; their tasks under the endpoint's ids, paged with one sealed cursor."""

    def __init__(self, fan_out: FanOut, cursors: Cursors) -> None:
        self.fan_out = fan_out
        self.cursors = cursors

    async def merged(self, route: VirtualRoute, msg: McpMessage, ctx: CallContext,
                     chain: Chain, session: Session | None) -> dict[str, Any]:
        caller = ctx.principal.key
        cursor = (msg.params or {}).get("cursor")
        if cursor is None:
            owned = ctx.task.owned if ctx.task is not None else {}
            pending = {m: "" for m in route.members
                       if any(t.startswith(tasks.member_task(m, "")) for t in owned)}
        else:
            pending = self.cursors.open(cursor, route.name, LIST, caller)
        asks = {m: request(msg, LIST, c or None) for m, c in pending.items()
                if m in route.members}
        results = await self.fan_out.ask(route, asks, ctx, chain, session)
        listed: list[dict[str, Any]] = []
        more: dict[str, str] = {}
        for member in route.members:  # in the endpoint's order
            result = results.get(member)
            if result is None:
                continue
            for task in result.get("tasks") or []:
                if isinstance(task, dict) and _task(member, task):
                    listed.append(task)
            nxt = result.get("nextCursor")
            if isinstance(nxt, str) and nxt:
                more[member] = nxt
        out: dict[str, Any] = {"tasks": listed}
        if more:
            out["nextCursor"] = self.cursors.seal(route.name, LIST, caller, more)
        return out
