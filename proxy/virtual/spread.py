"""A virtual endpoint's `Forwarding` (proxy/mcp/forwarding.py): each message spread to the
member (or members) it goes to, through the plain `Forwarder`.

`check` runs the policies once with the member's view where a member owns the message
(proxy/virtual/routing.py). `call` then routes it: a list goes to every member at once and
whatever has not answered within `list_timeout_s` is left out (proxy/virtual/fanout.py), the
answers merged and paged with a sealed cursor (proxy/virtual/lists.py); a call goes to the one
member that owns the name, with the member's original name, and the resource URIs in its
answer exposed as the endpoint names them (proxy/virtual/uris.py); `initialize` and
`server/discover` are answered here with the members' merged capabilities. Member sessions
are opened by the Forwarder's bridge when first needed, held per endpoint and caller, and
reopened when a member forgets one (proxy/virtual/members.py). What a member sends the client
on a call's stream, and the client's answers back, go through proxy/virtual/outgoing.py; a
legacy client's GET stream merges its members' (proxy/virtual/listeners.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from proxy.auth.principal import Principal
from proxy.chain import CallContext, Chain, Rewrite
from proxy.errors import MethodNotFound
from proxy.jsonrpc import McpMessage
from proxy.mcp import tasks
from proxy.mcp.forward import Forwarded, Forwarder
from proxy.mcp.forwarding import Listened, NoStream, Outgoing
from proxy.mcp.legs import Leg
from proxy.state import Session
from proxy.upstream import UpstreamRoute
from proxy.virtual import tasks as virtual_tasks
from proxy.virtual.cursor import Cursors
from proxy.virtual.exposed import Exposed
from proxy.virtual.fanout import FanOut
from proxy.virtual.listen import Merged
from proxy.virtual.listeners import Listeners
from proxy.virtual.lists import LISTS, Lists
from proxy.virtual.members import Members, context, outbound
from proxy.virtual.meta_tools import ToolSearch
from proxy.virtual.outgoing import MemberRequests
from proxy.virtual.route import VirtualRoute
from proxy.virtual.routing import ROUTED, Routing, Target, checked

__all__ = ["VirtualForwarder"]


class VirtualForwarder:
    relays_client_cancel = False  # a client's cancel stops at the gateway: no member hears it

    def __init__(self, forward: Forwarder, routes: Mapping[str, UpstreamRoute],
                 cursor_key: bytes, max_response_bytes: int = 16 * 1024 * 1024) -> None:
        self.forward = forward
        self.cursors = Cursors(cursor_key)
        # exposed name -> (member, member's name), per endpoint and kind: learned from lists
        self._names = Exposed()
        members = Members(forward, routes)  # the spine's live table, read per call
        # a member's list answer is held whole to be merged: at most max_response_bytes
        fan_out = FanOut(forward, members, max_response_bytes)
        self._lists = Lists(fan_out, self._names, self.cursors)
        self._tasks = virtual_tasks.Listing(fan_out, self.cursors)  # tasks/list, merged
        self._routing = Routing(members, self._names, self._lists)
        self.search = ToolSearch(self._lists)  # [endpoints.search]: its list, search_tools
        self._requests = MemberRequests(forward, self.cursors, members)
        self._listeners = Listeners(forward, members, self._requests)
        self._members = members

    def learning(self, learned: Callable[[str, McpMessage, dict[str, Any]], None]) -> None:
        """Tell `learned` (member, member's message, result) each member's list as it comes,
        before any rule: what the gateway keeps of each server's lists (proxy.seen)."""
        self._lists.learned = learned

    # -- policies ------------------------------------------------------------------------

    async def check(self, route: VirtualRoute, chain: Chain, msg: McpMessage,
                    ctx: CallContext) -> CallContext:
        """The chain run once for this message (`Routing.check`); for a routed message the
        context is the member's, and its `message` the member's message."""
        if self.search.searching(route, msg):  # search_tools: decided as the list it reads
            return await self.search.check(route, chain, msg, ctx)
        return await self._routing.check(route, chain, msg, ctx)

    async def usable_tasks(self, route: VirtualRoute, chain: Chain, ctx: CallContext
                           ) -> None:
        await virtual_tasks.usable(route, self._members, chain, ctx)

    async def resolve(self, route: VirtualRoute, msg: McpMessage, ctx: CallContext,
                      chain: Chain) -> Target:
        """The member and member's name a routed message names (`Routing.resolve`)."""
        return await self._routing.resolve(route, msg, ctx, chain)

    # -- forwarding ----------------------------------------------------------------------

    async def call(self, route: VirtualRoute, headers: Mapping[str, str], msg: McpMessage,
                   session: Session | None, ctx: CallContext, into: Forwarded,
                   chain: Chain) -> None:
        method = msg.method or ""
        modern = ctx.era == "modern"  # a result answered here is completed for its era
        if self.search.answers(route, msg):  # in search mode: tools/list, search_tools
            into.leg = await self.search.call(route, msg, ctx, chain, session)
        elif method in LISTS:
            cursor = (msg.params or {}).get("cursor")
            into.leg = Leg([], local=await self._lists.merged(route, msg, cursor, ctx, chain,
                                                              session), bridged=modern)
        elif method in ("initialize", "server/discover"):
            into.leg = Leg([], local=await self._lists.opening(route, msg, ctx, session))
        elif method in ("ping", "logging/setLevel"):
            into.leg = Leg([], local={}, bridged=modern)
        elif method == virtual_tasks.LIST:
            into.leg = Leg([], local=await self._tasks.merged(route, msg, ctx, chain, session),
                           bridged=modern)
        elif method in ROUTED or method in tasks.NAMED:
            if method in ROUTED:
                target = checked(route, msg, ctx)
                name, mname = target.member, target.name
            else:  # a task's request: to the member its binding names
                name, mname = virtual_tasks.target(route, ctx), None
            member = await self._members.route(route, name, session)
            mheaders, mmsg = outbound(msg, mname, session)
            await self.forward.call(member, mheaders, mmsg, None,
                                    context(ctx, member, leg=True), into)
            into.leg.route = member
            # its URIs and task ids, as exposed
            into.leg.shown = virtual_tasks.shown(name, method, msg.params)
            if not modern:  # a member is spoken to as a 2026-07-28 caller would
                if into.leg.bridged:  # a legacy member's result, for a legacy client: as it is
                    into.leg.legacy_result = True
                else:  # a 2026-07-28 member's, as the plain bridge does (Leg.rewrite)
                    into.leg.to_legacy_client = True
        else:
            raise MethodNotFound(data={"method": method})

    def json_answer(self, route: VirtualRoute, msg: McpMessage, forwarded: Forwarded,
                    rewrite: Rewrite | None, data: bytes) -> tuple[bytes, str | None]:
        member = forwarded.leg.route
        assert member is not None
        return self.forward.json_answer(member, msg, forwarded, rewrite, data)

    def notify_cancelled(self, route: VirtualRoute, leg: Leg, request_id: Any,
                         reason: str) -> None:
        if leg.route is not None:  # else no member had the call yet
            self.forward.notify_cancelled(leg.route, leg, request_id, reason)

    # -- what a member sends the client, and the client's answers --------------------------

    def views(self, route: VirtualRoute, leg: Leg, session: Session | None,
              ctx: CallContext) -> tuple[bool, Outgoing | None]:
        """Whether the relay refuses a member's request on the call's stream, and the view
        of each (proxy/virtual/outgoing.py: the member named, a request's id sealed)."""
        return self._requests.views(route, leg, session, ctx)

    def resumable(self, leg: Leg) -> bool:
        return False  # a member's stream is not the client's to resume

    async def one_way(self, route: VirtualRoute, headers: Mapping[str, str], msg: McpMessage,
                      session: Session | None, ctx: CallContext) -> None:
        """A client's answer goes to the member that asked; its members are told nothing
        else one-way (a client's cancel ends the call here)."""
        if msg.kind == "response":
            await self.respond(route, msg, session, ctx)

    async def respond(self, route: VirtualRoute, msg: McpMessage, session: Session | None,
                      ctx: CallContext) -> None:
        """A client's answer to a member's request, sent on to that member with the member's
        own id (`MemberRequests.respond`); one to no request of this session's is dropped."""
        await self._requests.respond(route, msg, session, ctx)

    # -- the GET stream and DELETE ---------------------------------------------------------

    async def listen(self, route: VirtualRoute, headers: Mapping[str, str],
                     session: Session | None, principal: Principal, draining: bool
                     ) -> Listened | NoStream:
        """The members' GET streams merged (proxy/virtual/listeners.py), for a gateway
        session: none without one."""
        return await self._listeners.listen(route, session, principal, draining)

    def stopped_listening(self, merged: Merged) -> None:
        self._listeners.stopped(merged)

    def members_changed(self, endpoints: Mapping[str, VirtualRoute]) -> None:
        """The registry changed the endpoints or the servers: each GET stream open on an
        endpoint whose members served changed follows the change (`Listeners`)."""
        self._listeners.members_changed(endpoints)

    async def end(self, route: VirtualRoute, headers: Mapping[str, str], session: Session
                  ) -> dict[str, str] | None:
        """A legacy client's DELETE: the member sessions held for its gateway session are
        ended too (best effort: a member that fails keeps its session until it expires)."""
        await self._members.end(route, session)
        return None
