"""Which member a virtual endpoint's message goes to, and the policy check on the way.

`check` runs the policies for the message once, as the spine does for a plain endpoint, but
with the member's view where a member owns the message: the endpoint's own access rules on the
exposed name (and an aliased tool's namespaced name), then the whole chain on the member's name
(its access rules and profiles, rate limits, egress, metering), so each policy sees the member
and the member's tool as on the member's own endpoint. A name is found by the members' lists
(`Exposed`), listed again on a miss at most once a while per caller; one no member lists
answers as a hidden one does. `checked` reads back the member `check` chose, for `call`.
"""

from __future__ import annotations

import dataclasses

import orjson

from proxy.chain import CallContext, Chain
from proxy.errors import HiddenTool, InternalError, InvalidParams
from proxy.jsonrpc import McpMessage
from proxy.mcp import names, tasks
from proxy.virtual import naming
from proxy.virtual import tasks as virtual_tasks
from proxy.virtual.exposed import Exposed
from proxy.virtual.lists import Lists, request
from proxy.virtual.members import Members, context
from proxy.virtual.route import VirtualRoute

# routed method -> (params field, kind of name)
ROUTED = {"tools/call": ("name", "tool"), "prompts/get": ("name", "prompt"),
          "resources/read": ("uri", "uri"), "resources/subscribe": ("uri", "uri"),
          "resources/unsubscribe": ("uri", "uri")}


@dataclasses.dataclass(frozen=True, slots=True)
class Target:
    member: str
    name: str  # the member's own name (or URI)
    msg: McpMessage  # the message as the member receives it


class Routing:
    """Finds a routed message's member and runs the policies with the member's view."""

    def __init__(self, members: Members, exposed: Exposed, lists: Lists) -> None:
        self.members = members
        self.exposed = exposed
        self.lists = lists  # a missed name: the members listed again
        # when a caller's missed name last had the members listed again, per endpoint and kind
        self._relists = names.Relists()

    async def check(self, route: VirtualRoute, chain: Chain, msg: McpMessage,
                    ctx: CallContext) -> CallContext:
        """Run the chain once for this message; the context the call goes on with. For a
        routed message that is the member's context, and its `message` the member's message
        (the member's own name, and the arguments as the policies left them): the spine
        forwards that, and reads the answer and the notifications on its stream with both,
        so every policy sees the member's message both ways; `call` routes by them."""
        ctx.virtual = True  # the endpoint's own view (a member's is made below)
        if msg.kind == "request" and msg.method in tasks.NAMED:  # routed by its binding
            return await virtual_tasks.check(route, self.members, chain, msg, ctx)
        if msg.kind != "request" or msg.method not in ROUTED:
            await chain.run(msg, ctx, without=("egress",))  # egress: per member, in the list
            if msg.method == virtual_tasks.LIST:  # the tasks of tools still the caller's
                await virtual_tasks.usable(route, self.members, chain, ctx)
            return ctx
        target = await self.resolve(route, msg, ctx, chain)
        await self._endpoint_rules(route, chain, msg, ctx, target)
        mctx = context(ctx, self.members.registered(target.member))
        try:
            await chain.run(target.msg, mctx)
        except HiddenTool as exc:  # unknown, as the caller knows it: by its exposed name
            raise hidden(exc, msg) from None
        mctx.message = mctx.message or target.msg
        note = f"virtual: member {target.member}, name {target.name[:200]}"
        if msg.via is not None:  # called through tool search's call_tool (meta_tools.py)
            note = f"via {msg.via} (call_tool); {note}"
        mctx.audit_note = f"{mctx.audit_note}; {note}" if mctx.audit_note else note
        return mctx

    async def _endpoint_rules(self, route: VirtualRoute, chain: Chain, msg: McpMessage,
                              ctx: CallContext, target: Target) -> None:
        """The endpoint's own access rules, on every name the tool has: a tool called by its
        alias is refused by a pattern that matches its namespaced name too (`tools_deny =
        ["evil__delete_*"]` holds for `nuke = "evil:delete_all"`, as `["nuke"]` does)."""
        await chain.run(msg, ctx, only=("access",))
        if msg.method != "tools/call" or msg.tool not in route.aliases:
            return
        namespaced = naming.exposed(target.member, target.name, route.separator)
        try:
            await chain.run(dataclasses.replace(msg, params={**(msg.params or {}),
                                                             "name": namespaced}),
                            ctx, only=("access",))
        except HiddenTool as exc:
            raise hidden(exc, msg) from None

    async def resolve(self, route: VirtualRoute, msg: McpMessage, ctx: CallContext,
                      chain: Chain) -> Target:
        """The member and member's name a routed message names. A tool or prompt is known
        by a member's list (learned from every list through the endpoint, whatever the
        caller may see of it, and listed again on a miss): a name no member lists answers
        as a hidden one does, never passed on for the member to tell apart."""
        field, kind = ROUTED[msg.method or ""]
        params = msg.params or {}
        exposed = params.get(field)
        if not isinstance(exposed, str):
            raise InvalidParams(f"Invalid params: {field} must be a string")
        owner = self.exposed.owner(route, kind, exposed)
        if owner is None and kind != "uri" and self._may_relist(route, kind, ctx):
            listing = "tools/list" if kind == "tool" else "prompts/list"
            await self.lists.merged(route, request(msg, listing), None, ctx, chain)
            owner = self.exposed.owner(route, kind, exposed)
        if owner is None or not self.members.served(owner[0]):
            raise InvalidParams(names.unknown(kind, exposed))
        member, name = owner
        renamed = {**params, field: name}
        body = orjson.dumps({"jsonrpc": "2.0", "id": msg.id, "method": msg.method,
                             "params": renamed})
        return Target(member, name, McpMessage(msg.kind, msg.id, msg.method, renamed, body))

    def _may_relist(self, route: VirtualRoute, kind: str, ctx: CallContext) -> bool:
        """A name not learned is looked for in the members' lists again, at most once per
        RELIST_S per endpoint and caller: a caller sending names no member has costs the
        members one list a while, not one per call."""
        return self._relists.may((route.name, kind, ctx.principal.key), ctx.clock())


def checked(route: VirtualRoute, msg: McpMessage, ctx: CallContext) -> Target:
    """The member a routed message goes to, as `check` left it: its context the member's, the
    message the member's (so a rewritten message keeps its routing)."""
    field, _ = ROUTED[msg.method or ""]
    name = (msg.params or {}).get(field)
    if ctx.endpoint not in route.members or not isinstance(name, str):
        raise InternalError(f"a message for /mcp/{route.name} was not checked")
    return Target(ctx.endpoint, name, msg)


def hidden(exc: HiddenTool, msg: McpMessage) -> HiddenTool:
    """A member's (or a second name's) refusal, answered by the name the caller used; the
    audit keeps the rule that decided."""
    field, kind = ROUTED[msg.method or ""]
    exposed = str((msg.params or {}).get(field))
    out = HiddenTool(exc.reason, exposed)
    out.detail = names.unknown(kind, exposed)
    out.decided_by = exc.decided_by
    return out
