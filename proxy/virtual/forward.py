"""Step 4 of the path for a virtual endpoint: the member (or members) a message goes to.

`check` runs the policies for the message once, as the spine does for a plain endpoint, but
with the member's view where a member owns the message: the endpoint's own access rules on the
exposed name, then the whole chain on the member's name (its access rules and profiles, rate
limits, egress, metering), so each policy sees the member and the member's tool as on the
member's own endpoint. `call` then routes it: a list goes to every member at once, each
through the plain `Forwarder`, and whatever has not answered within `list_timeout_s` is left
out; a call goes to the one member that owns the name, with the member's original name;
`initialize` and `server/discover` are answered here with the members' merged capabilities.
Member sessions are opened by the Forwarder's bridge when first needed, held per endpoint and
caller, and reopened when a member forgets one.

What a member sends the client on a call's stream goes through `outgoing`: a server-to-client
request (sampling, elicitation, roots) gets an id sealed to the member and the client's
session (`Cursors.seal_id`), which `respond` opens when the client answers, to send the answer
on to that member's session with the member's own id; a log message or a progress notice
names the member; a member's `list_changed` is the endpoint's own.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

import orjson

from proxy import __version__
from proxy.auth.principal import Principal
from proxy.chain import CallContext, Chain, Rewrite
from proxy.errors import (
    Draining,
    GatewayError,
    HiddenTool,
    InternalError,
    InvalidParams,
    MethodNotFound,
    UpstreamFailure,
    UpstreamProtocolError,
    UpstreamUnavailable,
)
from proxy.jsonrpc import McpMessage
from proxy.mcp import bridge, eras, names
from proxy.mcp.forward import Forwarded, Forwarder, result_from_stream
from proxy.mcp.forwarding import Listened, NoStream, Outgoing
from proxy.mcp.legs import Leg, after
from proxy.state import Session
from proxy.upstream import UpstreamRoute
from proxy.virtual import naming
from proxy.virtual.cursor import Cursors
from proxy.virtual.listen import Merged
from proxy.virtual.route import VirtualRoute

log = logging.getLogger("tollhouse.virtual")

# list method -> (result key, item field, kind of name)
LISTS = {"tools/list": ("tools", "name", "tool"), "prompts/list": ("prompts", "name", "prompt"),
         "resources/list": ("resources", "uri", "uri"),
         "resources/templates/list": ("resourceTemplates", "uriTemplate", "uri")}
# routed method -> (params field, kind of name)
ROUTED = {"tools/call": ("name", "tool"), "prompts/get": ("name", "prompt"),
          "resources/read": ("uri", "uri"), "resources/subscribe": ("uri", "uri"),
          "resources/unsubscribe": ("uri", "uri")}
LOCAL = ("initialize", "server/discover", "ping", "logging/setLevel")
PER_MEMBER = ("access", "egress")  # what a list asks of each member it reaches
CAPABILITIES = ("tools", "prompts", "resources", "logging", "completions")
LIST_CHANGED = ("tools", "prompts", "resources")  # relayed as the endpoint's own
RELAYED = ("sampling", "elicitation", "roots")  # a client's capabilities a member may use


@dataclasses.dataclass(frozen=True, slots=True)
class Target:
    member: str
    name: str  # the member's own name (or URI)
    msg: McpMessage  # the message as the member receives it


class VirtualForwarder:
    def __init__(self, forward: Forwarder, routes: Mapping[str, UpstreamRoute],
                 cursor_key: bytes, max_response_bytes: int = 16 * 1024 * 1024) -> None:
        self.forward = forward
        self.routes = routes  # the spine's live table: members are read from it per call
        self.cursors = Cursors(cursor_key)
        # a member's list answer is held whole to be merged: at most this
        # (server.max_response_bytes)
        self.max_response_bytes = max_response_bytes
        # exposed name -> (member, member's name), per endpoint and kind: learned from lists
        self._names: dict[tuple[str, str], dict[str, tuple[str, str]]] = {}
        # when a caller's missed name last had the members listed again, per endpoint and kind
        self._relists = names.Relists()
        self._stragglers: set[asyncio.Task[Any]] = set()
        # the merged GET streams open now, with the gateway session and caller of each
        self._listening: dict[Merged, tuple[Session, Principal]] = {}

    # -- policies ------------------------------------------------------------------------

    async def check(self, route: VirtualRoute, chain: Chain, msg: McpMessage,
                    ctx: CallContext) -> CallContext:
        """Run the chain once for this message; the context the call goes on with. For a
        routed message that is the member's context, and its `message` the member's message
        (the member's own name, and the arguments as the policies left them): the spine
        forwards that, and reads the answer and the notifications on its stream with both,
        so every policy sees the member's message both ways; `call` routes by them."""
        if msg.kind != "request" or msg.method not in ROUTED:
            await chain.run(msg, ctx, without=("egress",))  # egress: per member, in the list
            return ctx
        target = await self.resolve(route, msg, ctx, chain)
        await self._endpoint_rules(route, chain, msg, ctx, target)
        member = self.routes[target.member]
        mctx = self._context(ctx, member)
        try:
            await chain.run(target.msg, mctx)
        except HiddenTool as exc:  # unknown, as the caller knows it: by its exposed name
            raise _hidden(exc, msg) from None
        mctx.message = mctx.message or target.msg
        note = f"virtual: member {target.member}, name {target.name[:200]}"
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
            raise _hidden(exc, msg) from None

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
        owner = self._owner(route, kind, exposed)
        if owner is None and kind != "uri" and self._may_relist(route, kind, ctx):
            listing = "tools/list" if kind == "tool" else "prompts/list"
            await self._merged(route, _request(msg, listing), None, ctx, chain)
            owner = self._owner(route, kind, exposed)
        if owner is None or owner[0] not in self.routes:
            raise InvalidParams(names.unknown(kind, exposed))
        member, name = owner
        renamed = {**params, field: name}
        body = orjson.dumps({"jsonrpc": "2.0", "id": msg.id, "method": msg.method,
                             "params": renamed})
        return Target(member, name, McpMessage(msg.kind, msg.id, msg.method, renamed, body))

    def _owner(self, route: VirtualRoute, kind: str, exposed: str) -> tuple[str, str] | None:
        """(member, member's name) of an exposed name, if a member listed it and the endpoint
        exposes it under this name now: an aliased tool has its alias only (its namespaced
        name is unknown), and a name learned before an alias or a member changed is not."""
        if kind == "uri":
            return naming.member_uri(exposed, route.members)
        owner = self._names.get((route.name, kind), {}).get(exposed)
        if owner is None or owner[0] not in route.members \
                or self._expose(route, kind, *owner) != exposed:
            return None
        return owner

    def _may_relist(self, route: VirtualRoute, kind: str, ctx: CallContext) -> bool:
        """A name not learned is looked for in the members' lists again, at most once per
        RELIST_S per endpoint and caller: a caller sending names no member has costs the
        members one list a while, not one per call."""
        return self._relists.may((route.name, kind, ctx.principal.key), ctx.clock())

    # -- forwarding ----------------------------------------------------------------------

    async def call(self, route: VirtualRoute, headers: Mapping[str, str], msg: McpMessage,
                   session: Session | None, ctx: CallContext, into: Forwarded,
                   chain: Chain) -> None:
        method = msg.method or ""
        modern = ctx.era == "modern"  # a result answered here is completed for its era
        if method in LISTS:
            cursor = (msg.params or {}).get("cursor")
            into.leg = Leg([], local=await self._merged(route, msg, cursor, ctx, chain,
                                                        session), bridged=modern)
        elif method in ("initialize", "server/discover"):
            into.leg = Leg([], local=await self._opening(route, msg, ctx, session))
        elif method in ("ping", "logging/setLevel"):
            into.leg = Leg([], local={}, bridged=modern)
        elif method in ROUTED:
            target = _checked(route, msg, ctx)
            member = await self._member(route, target.member, session)
            mheaders, mmsg = _outbound(target.msg, target.name, session)
            await self.forward.call(member, mheaders, mmsg, None,
                                    self._context(ctx, member, leg=True), into)
            into.leg.route = member
            if not modern:  # a member is spoken to as a 2026-07-28 caller would
                if into.leg.bridged:  # a legacy member's result, for a legacy client: as it is
                    into.leg.legacy_result = True
                else:  # a 2026-07-28 member's, as the plain bridge does (Leg.rewrite)
                    into.leg.to_legacy_client = True
        else:
            raise MethodNotFound(data={"method": method})

    # -- what a member sends the client, and the client's answers --------------------------

    relays_client_cancel = False  # a client's cancel stops at the gateway: no member hears it

    def views(self, route: VirtualRoute, leg: Leg, session: Session | None,
              ctx: CallContext) -> tuple[bool, Outgoing | None]:
        """What the relay does with a member's requests and notifications on a call's
        stream: a legacy member's request to a 2026-07-28 client ends the call, as on a plain
        endpoint's era bridge (nothing can carry the question; a legacy client's can); each
        is viewed (`_outgoing`: the member named, a request's id sealed)."""
        refuse = leg.bridged and ctx.era == "modern"
        if leg.route is None:  # answered without a member
            return refuse, None
        bound = _bound(session, ctx.principal.key)
        member = leg.route.name
        return refuse, lambda obj: self._outgoing(route.name, member, bound, obj)

    def resumable(self, leg: Leg) -> bool:
        return False  # a member's stream is not the client's to resume

    async def one_way(self, route: VirtualRoute, headers: Mapping[str, str], msg: McpMessage,
                      session: Session | None, ctx: CallContext) -> None:
        """A client's answer goes to the member that asked; its members are told nothing
        else one-way (a client's cancel ends the call here)."""
        if msg.kind == "response":
            await self.respond(route, msg, session, ctx)

    def _outgoing(self, endpoint: str, member: str, bound: str, obj: dict[str, Any]) -> bool:
        method = obj.get("method")
        if "id" in obj:  # a request to the client: answered under an id only we can open
            obj["id"] = self.cursors.seal_id(endpoint, bound, member, obj["id"])
            return True
        params = obj.get("params")
        if not isinstance(params, dict):
            return False
        if method == "notifications/message":
            logger = params.get("logger")
            params["logger"] = f"{member}/{logger}" if isinstance(logger, str) and logger \
                else member
            return True
        if method == "notifications/progress":  # its progressToken is the client's own
            text = params.get("message")
            params["message"] = f"{member}: {text}" if isinstance(text, str) else member
            return True
        return False  # list_changed and the rest: as the endpoint's own, unchanged

    async def respond(self, route: VirtualRoute, msg: McpMessage, session: Session | None,
                      ctx: CallContext) -> None:
        """A client's answer to a member's request, sent on to that member's session with the
        member's own id. One under an id this endpoint did not give this session (forged,
        altered, another caller's) reaches no member: accepted and dropped, as a plain
        endpoint's upstream drops an answer to no request of its own."""
        opened = self.cursors.open_id(msg.id, route.name, _bound(session, ctx.principal.key))
        if opened is None or opened[0] not in route.members or opened[0] not in self.routes:
            log.info("/mcp/%s: an answer to no member's request: dropped", route.name)
            return
        name, original = opened
        member = await self._member(route, name, session)
        body = orjson.loads(msg.body)
        body["id"] = original
        status = await self.forward.answer_held(member, ctx.principal, orjson.dumps(body))
        if status is None:  # the member session is gone, and the request with it
            log.info("/mcp/%s: an answer for member %s, whose session is gone: dropped",
                     route.name, name)
        elif status >= 300:
            log.info("/mcp/%s: member %s refused an answer: HTTP %d", route.name, name, status)

    # -- the GET stream --------------------------------------------------------------------

    async def listen(self, route: VirtualRoute, headers: Mapping[str, str],
                     session: Session | None, principal: Principal, draining: bool
                     ) -> Listened | NoStream:
        """The members' GET streams merged (proxy/virtual/listen.py), for a gateway session:
        none without one."""
        if session is None:
            return NoStream({"Allow": "POST, DELETE"},
                            "no GET stream without a session on a virtual endpoint")
        if draining:
            raise Draining()
        merged = await self._merge(route, session, principal)
        return Listened(merged, merged.aclose, stopped=partial(self.stopped_listening, merged))

    async def _merge(self, route: VirtualRoute, session: Session, principal: Principal
                     ) -> Merged:
        """The merged GET stream of the legacy members, each on the member session held for
        this gateway session (opened now if there is none). A member that offers no GET
        stream, or fails to open one, is left out (logged); a 2026-07-28 member has none."""
        merged = Merged(route.name, self._present(route.members))
        self._listening[merged] = (session, principal)  # a change meanwhile is followed too
        try:
            opened = await asyncio.gather(*(self._member_stream(route, name, session,
                                                                principal)
                                            for name in merged.members))
        except BaseException:
            self.stopped_listening(merged)
            await merged.aclose()
            raise
        bound = _bound(session, session.principal_key)
        for name, response in opened:
            if response is None:
                continue
            if name not in merged.members:  # it left while the streams opened
                await response.aclose()
                continue
            merged.add(name, response, partial(self._outgoing, route.name, name, bound))
        return merged

    def stopped_listening(self, merged: Merged) -> None:
        self._listening.pop(merged, None)

    def members_changed(self, endpoints: Mapping[str, VirtualRoute]) -> None:
        """The registry changed the endpoints or the servers (/api/v1, a reload, another
        gateway's write): each GET stream on an endpoint whose members served changed is
        told its lists changed, listens to the members that joined (each opened in the
        stream's own task) and stops listening to those that left (their streams closed).
        Cheap: nothing to do without a GET stream open."""
        for merged, (session, principal) in list(self._listening.items()):
            now = endpoints.get(merged.endpoint)
            members = self._present(now.members if now is not None else ())
            if members == merged.members:
                continue
            before, merged.members = merged.members, members
            for name in before:
                if name not in members:
                    merged.drop(name)
            if now is not None:
                for name in members:
                    if name not in before:
                        merged.join(name, partial(self._joined, now, name, session, principal))
            merged.announce()

    async def _joined(self, route: VirtualRoute, name: str, session: Session,
                      principal: Principal) -> tuple[Any, Callable[[dict[str, Any]], bool]] | None:
        """The GET stream of a member that joined while a client listens, and its view."""
        _, response = await self._member_stream(route, name, session, principal)
        if response is None:
            return None
        return response, partial(self._outgoing, route.name, name,
                                 _bound(session, session.principal_key))

    def _present(self, members: tuple[str, ...]) -> tuple[str, ...]:
        """The members served now (one registered or removed through /api/v1/servers joins
        or leaves the endpoint)."""
        return tuple(name for name in members if name in self.routes)

    async def _member_stream(self, route: VirtualRoute, name: str, session: Session,
                             principal: Principal) -> tuple[str, Any]:
        try:
            member = await self._member(route, name, session)
            if member.era != "legacy":
                return name, None
            response = await self.forward.listen_held(member, principal, session.principal_key)
            if response is None:  # stateless: no stream to listen on
                return name, None
        except GatewayError as exc:
            log.info("/mcp/%s: no GET stream from member %s: %s", route.name, name, exc)
            return name, None
        if response.status_code >= 300 or not response.headers.get(
                "content-type", "").startswith("text/event-stream"):
            log.info("/mcp/%s: member %s offers no GET stream (HTTP %d)", route.name, name,
                     response.status_code)
            await response.aclose()
            return name, None
        return name, response

    def notify_cancelled(self, route: VirtualRoute, leg: Leg, request_id: Any,
                         reason: str) -> None:
        if leg.route is not None:  # else no member had the call yet
            self.forward.notify_cancelled(leg.route, leg, request_id, reason)

    def json_answer(self, route: VirtualRoute, msg: McpMessage, forwarded: Forwarded,
                    rewrite: Rewrite | None, data: bytes) -> tuple[bytes, str | None]:
        member = forwarded.leg.route
        assert member is not None
        return self.forward.json_answer(member, msg, forwarded, rewrite, data)

    async def _member(self, route: VirtualRoute, name: str, session: Session | None
                      ) -> UpstreamRoute:
        """The member's route as this endpoint uses it: its era settled (learned once per
        upstream), its held sessions its own, by state key: per endpoint and caller, and per
        gateway session for a legacy client that has one, whose member sessions declare the
        capabilities that client declared (`_relayed`)."""
        base = self.routes.get(name)
        if base is None:
            raise UpstreamUnavailable(f"member {name} is not registered")
        era = await self.forward.era_of(base)
        if session is None:  # a 2026-07-28 caller is refused a member's requests: none declared
            return dataclasses.replace(base, era=era, state_key=f"{base.state_key} @{route.name}")
        return dataclasses.replace(base, era=era,
                                   state_key=f"{base.state_key} @{route.name}/{session.id_hash}",
                                   client_capabilities=_relayed(session.bridged_envelope))

    async def end(self, route: VirtualRoute, headers: Mapping[str, str], session: Session
                  ) -> dict[str, str] | None:
        """A legacy client's DELETE: the member sessions held for its gateway session are
        ended too (best effort: a member that fails keeps its session until it expires)."""
        await asyncio.gather(*(self._end_member(route, name, session)
                               for name in route.members if name in self.routes))
        return None

    async def _end_member(self, route: VirtualRoute, name: str, session: Session) -> None:
        try:
            member = await self._member(route, name, session)
            await self.forward.end_held(member, session.principal_key)
        except GatewayError as exc:
            log.info("/mcp/%s: could not end the session at member %s: %s", route.name, name,
                     exc)

    @staticmethod
    def _context(ctx: CallContext, member: UpstreamRoute, *, leg: bool = False) -> CallContext:
        """The member's view of the call: for its policies (the caller's era), or for the
        Forwarder (`leg`: always 2026-07-28, so a legacy member's session is held for this
        endpoint and caller by the bridge, and a 2026-07-28 member is spoken to directly)."""
        return CallContext(ctx.principal, member.name, member.url_text,
                           era="modern" if leg else ctx.era,
                           session_hash=ctx.session_hash, arguments_size=ctx.arguments_size,
                           api_key_id=ctx.api_key_id, peer_ip=ctx.peer_ip, headers=ctx.headers,
                           clock=ctx.clock)

    async def _ask(self, route: VirtualRoute, member_name: str, msg: McpMessage,
                   ctx: CallContext, chain: Chain, session: Session | None,
                   seen: Rewrite | None = None) -> dict[str, Any]:
        """One member's result for a message the gateway fans out (a list, discover), with the
        member's own access and egress decisions and its result rewriters applied (`seen`
        reads it before they do)."""
        member = await self._member(route, member_name, session)
        mctx = self._context(ctx, member)
        await chain.run(msg, mctx, only=PER_MEMBER)
        mheaders, mmsg = _outbound(msg, None, session)
        into = Forwarded(Leg([]))
        await self.forward.call(member, mheaders, mmsg, None,
                                self._context(ctx, member, leg=True), into)
        rewrite = into.leg.rewrite(after(seen, chain.rewriter(mmsg, mctx)), mmsg.method)
        if into.response is None:
            result = into.leg.local or {}
            if rewrite is not None:
                rewrite(result)
            return result
        try:
            if into.response.headers.get("content-type", "").startswith("text/event-stream"):
                result = await result_from_stream(into.response, mmsg.id,
                                                  self.max_response_bytes)
                if rewrite is not None:
                    rewrite(result)
                return result
            data, _ = await self.forward.json_body(into, held=True,
                                                   limit=self.max_response_bytes, head=0)
            data, error = self.forward.json_answer(member, mmsg, into, rewrite, data)
        finally:
            await into.response.aclose()
        if error is not None:
            raise UpstreamFailure(f"member {member_name}: {error[:200]}")
        obj = orjson.loads(data)
        result = obj.get("result")
        if not isinstance(result, dict):
            raise UpstreamProtocolError()
        return result

    async def _fan_out(self, route: VirtualRoute, members: Mapping[str, McpMessage],
                       ctx: CallContext, chain: Chain, session: Session | None,
                       seen: Callable[[str], Rewrite] | None = None
                       ) -> dict[str, dict[str, Any]]:
        """Every member asked at once; what has not answered within list_timeout_s, or
        failed, is left out (logged), and asked again on the next request."""
        tasks = {name: asyncio.ensure_future(self._ask(
                     route, name, m, ctx, chain, session,
                     seen=None if seen is None else seen(name)))
                 for name, m in members.items()}
        if not tasks:
            return {}
        _, pending = await asyncio.wait(tasks.values(), timeout=route.list_timeout_s)
        out: dict[str, dict[str, Any]] = {}
        for name, task in tasks.items():
            if task in pending:
                task.cancel()
                self._stragglers.add(task)
                task.add_done_callback(self._stragglers.discard)
                log.warning("/mcp/%s: member %s did not answer %s within %.1f s: left out",
                            route.name, name, members[name].method, route.list_timeout_s)
                continue
            exc = task.exception()
            if exc is None:
                out[name] = task.result()
            elif isinstance(exc, GatewayError):
                log.warning("/mcp/%s: member %s left out of %s: %s", route.name, name,
                            members[name].method, exc)
            else:
                log.error("/mcp/%s: member %s failed on %s", route.name, name,
                          members[name].method, exc_info=exc)
        return out

    async def _merged(self, route: VirtualRoute, msg: McpMessage, cursor: object,
                      ctx: CallContext, chain: Chain, session: Session | None = None
                      ) -> dict[str, Any]:
        method = msg.method or ""
        key, field, kind = LISTS[method]
        caller = ctx.principal.key
        pending = {m: "" for m in route.members} if cursor is None else \
            self.cursors.open(cursor, route.name, method, caller)
        asks = {}
        for member, member_cursor in pending.items():
            if member not in route.members:
                continue
            asks[member] = _request(msg, method, member_cursor or None)
        listed: dict[str, list[str]] = {}  # each member's names, before any rule hides one

        def reader(member: str) -> Rewrite:
            def read(result: dict[str, Any]) -> bool:
                listed[member] = names.listed_names(result, key, field) or []
                return False
            return read

        results = await self._fan_out(route, asks, ctx, chain, session,
                                      None if kind == "uri" else reader)
        self._learn(route, kind, listed)
        items: list[dict[str, Any]] = []
        seen: set[str] = set()
        more: dict[str, str] = {}
        for member in route.members:  # in the endpoint's order, whatever answered first
            result = results.get(member)
            if result is None:
                continue
            for item in result.get(key) or []:
                if not isinstance(item, dict) or not isinstance(item.get(field), str):
                    continue
                original = item[field]
                exposed = self._expose(route, kind, member, original)
                if exposed in seen:
                    log.warning("/mcp/%s: %s %r of member %s collides with an earlier "
                                "member's: left out", route.name, kind, exposed, member)
                    ctx.audit_note = (ctx.audit_note or "") + \
                        f" left out {kind} {exposed[:80]} of {member} (collision);"
                    continue
                seen.add(exposed)
                if kind == "tool" and exposed in route.aliases and \
                        await self._alias_denied(route, chain, ctx, member, original):
                    continue
                items.append({**item, field: exposed})
            nxt = result.get("nextCursor")
            if isinstance(nxt, str) and nxt:
                more[member] = nxt
        out: dict[str, Any] = {key: items}
        if more:
            out["nextCursor"] = self.cursors.seal(route.name, method, caller, more)
        return out

    def _learn(self, route: VirtualRoute, kind: str, listed: Mapping[str, list[str]]) -> None:
        """The names the members listed, as this endpoint exposes them (the first member in
        the endpoint's order keeps a name two would share)."""
        if kind == "uri":
            return
        names = self._names.setdefault((route.name, kind), {})
        claimed: set[str] = set()
        for member in route.members:
            for original in listed.get(member, ()):
                exposed = self._expose(route, kind, member, original)
                if exposed not in claimed:
                    claimed.add(exposed)
                    names[exposed] = (member, original)

    async def _alias_denied(self, route: VirtualRoute, chain: Chain, ctx: CallContext,
                            member: str, tool: str) -> bool:
        """Whether the endpoint's rules refuse an aliased tool by its namespaced name (its
        alias is filtered from the list with every other name, by the spine's rewrite)."""
        namespaced = naming.exposed(member, tool, route.separator)
        call = McpMessage("request", None, "tools/call", {"name": namespaced}, b"")
        try:
            await chain.run(call, ctx, only=("access",))
        except HiddenTool:
            return True
        return False

    @staticmethod
    def _expose(route: VirtualRoute, kind: str, member: str, original: str) -> str:
        if kind == "uri":
            return naming.exposed_uri(member, original)
        if kind == "tool":
            alias = route.aliased.get((member, original))
            if alias is not None:
                return alias
        return naming.exposed(member, original, route.separator)

    async def _opening(self, route: VirtualRoute, msg: McpMessage, ctx: CallContext,
                       session: Session | None) -> dict[str, Any]:
        """initialize or server/discover, answered with the members' merged capabilities
        (only what the endpoint can deliver: no subscribe; to a legacy client, list_changed,
        which any member's notice and a change of the members is relayed as)."""
        discover = McpMessage("request", "tollhouse-virtual", "server/discover", {}, b"")
        results = await self._fan_out(route, dict.fromkeys(route.members, discover), ctx,
                                      _NO_POLICIES, session)
        caps: dict[str, Any] = {}
        for result in results.values():
            for key, value in (result.get("capabilities") or {}).items():
                if key in CAPABILITIES and isinstance(value, dict):
                    caps.setdefault(key, {})
        info = {"name": route.name, "version": __version__}
        if msg.method == "initialize":
            for key in LIST_CHANGED:
                if key in caps:
                    caps[key] = {"listChanged": True}
            requested = (msg.params or {}).get("protocolVersion")
            version = requested if requested in eras.LEGACY_VERSIONS else bridge.LEGACY_VERSION
            return {"protocolVersion": version, "capabilities": caps, "serverInfo": info}
        return {"supportedVersions": list(eras.MODERN_VERSIONS), "capabilities": caps,
                "resultType": "complete", "ttlMs": 0, "cacheScope": "private",
                "_meta": {eras.SERVER_INFO: info}}


def _relayed(envelope: dict[str, Any] | None) -> dict[str, Any]:
    """What a legacy client declared in its initialize (kept with its gateway session, in the
    shared state), as far as the gateway relays it: the requests a member may send it, and
    no notice from the client (roots' listChanged: a member is sent none)."""
    declared = envelope.get(eras.CLIENT_CAPS) if envelope is not None else None
    if not isinstance(declared, dict):
        return {}
    out = {key: declared[key] for key in RELAYED if isinstance(declared.get(key), dict)}
    if "roots" in out:
        out["roots"] = {k: v for k, v in out["roots"].items() if k != "listChanged"}
    return out


def _checked(route: VirtualRoute, msg: McpMessage, ctx: CallContext) -> Target:
    """The member a routed message goes to, as `check` left it: its context the member's, the
    message the member's (so a rewritten message keeps its routing)."""
    field, _ = ROUTED[msg.method or ""]
    name = (msg.params or {}).get(field)
    if ctx.endpoint not in route.members or not isinstance(name, str):
        raise InternalError(f"a message for /mcp/{route.name} was not checked")
    return Target(ctx.endpoint, name, msg)


def _hidden(exc: HiddenTool, msg: McpMessage) -> HiddenTool:
    """A member's (or a second name's) refusal, answered by the name the caller used; the
    audit keeps the rule that decided."""
    field, kind = ROUTED[msg.method or ""]
    exposed = str((msg.params or {}).get(field))
    hidden = HiddenTool(exc.reason, exposed)
    hidden.detail = names.unknown(kind, exposed)
    hidden.decided_by = exc.decided_by
    return hidden


def _bound(session: Session | None, caller: str) -> str:
    """What a sealed request id is bound to: the client's gateway session, else the caller."""
    return f"session {session.id}" if session is not None else f"caller {caller}"


def _request(msg: McpMessage, method: str, cursor: str | None = None) -> McpMessage:
    params: dict[str, Any] = {}
    meta = (msg.params or {}).get("_meta")
    if isinstance(meta, dict):
        params["_meta"] = meta
    if cursor:
        params["cursor"] = cursor
    return McpMessage("request", msg.id if msg.id is not None else "tollhouse-virtual",
                      method, params, b"")


_NO_POLICIES = Chain(())


def _outbound(msg: McpMessage, name: str | None, session: Session | None
              ) -> tuple[dict[str, str], McpMessage]:
    """The member's request: always on the member's own era through the Forwarder (as a
    2026-07-28 caller would, so that its sessions are held per endpoint and caller); a legacy
    client's request gets the envelope its initialize declared."""
    params = dict(msg.params or {})
    meta = params.get("_meta")
    if not (isinstance(meta, dict) and eras.PV in meta):
        declared = session.bridged_envelope if session is not None else None
        envelope = bridge.envelope_for(declared or {eras.CLIENT_CAPS: {},
                                                    eras.CLIENT_INFO: bridge.CLIENT_INFO})
        params["_meta"] = {**(meta if isinstance(meta, dict) else {}), **envelope}
    body = orjson.dumps({"jsonrpc": "2.0", "id": msg.id, "method": msg.method,
                         "params": params})
    headers = {"content-type": "application/json",
               "mcp-protocol-version": eras.MODERN_VERSIONS[0], "mcp-method": msg.method or ""}
    if name is not None:
        headers["mcp-name"] = bridge.encode_header(name)
    return headers, McpMessage("request", msg.id, msg.method, params, body)
