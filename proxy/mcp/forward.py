"""Forwarding a call to a plain upstream (a URL, a caller's own URL, a local process).

A `Forwarder` is a plain upstream's `Forwarding` (proxy/mcp/forwarding.py): it has the leg each
call takes chosen (`proxy.mcp.legs`: the headers, the upstream session, a person's own upstream
token, a bridge between the eras), sends it, makes the retries a call may need, and hands back
the upstream's answer with its status checked: a 2xx still open for the spine to relay, or the
GatewayError it amounts to. The three retries:
- a 2026-07-28 caller bridged onto a legacy upstream whose session the upstream forgot (404):
  the session is reopened and the call sent again;
- a `per_user` upstream that refused the person's token (401): refreshed once, sent again;
- a legacy `initialize` that a 2026-07-28-only upstream refused: answered by the gateway from
  the upstream's `server/discover`.
On a plain endpoint it also keeps the tools and prompts the upstream lists (`proxy.mcp.names`):
a call naming one the upstream does not have is answered here as a hidden one is, never sent.
What has no call to answer (a notification, a client's response, the GET stream, DELETE) and
the cancel notices a legacy upstream needs go through its `Sideband` (`proxy.mcp.sideband`),
which also says what an answer that is not 2xx amounts to. The spine (`gateway.py`) holds one.
"""

from __future__ import annotations

import copy
import logging
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from proxy.auth.principal import Principal
from proxy.chain import CallContext, Chain, Rewrite
from proxy.connect.manager import Connections
from proxy.errors import GatewayError, InvalidParams, UpstreamFailure, UpstreamProtocolError
from proxy.jsonrpc import McpMessage, response_outcome
from proxy.mcp import names, tasks
from proxy.mcp.bridge import Bridge
from proxy.mcp.forwarding import Listened, NoStream, Outgoing
from proxy.mcp.legs import Leg, Legs, person_header
from proxy.mcp.sideband import Sideband, Spawn
from proxy.mcp.sse import EventSplitter, event_data
from proxy.state import Session, SessionStore
from proxy.state.learned import BridgeStore
from proxy.traced import CURRENT
from proxy.upstream import BodyChunks, UpstreamAnswer, UpstreamClient, UpstreamRoute, read_head
from proxy.upstream.identity import IdentityForwarder

log = logging.getLogger("tollhouse.forward")

@dataclass(slots=True)
class Forwarded:
    """A call as the upstream answered it: a 2xx `response` still open (the caller reads and
    closes it), or a `leg.local` result the gateway gives itself."""

    leg: Leg
    response: UpstreamAnswer | None = None


class Forwarder:
    def __init__(self, upstream: UpstreamClient, sessions: SessionStore, bridged: BridgeStore,
                 *, identity: IdentityForwarder, connections: Connections | None,
                 spawn: Spawn, max_response_bytes: int = 16 * 1024 * 1024) -> None:
        self.upstream = upstream
        self.bridge = Bridge(upstream, bridged)
        self.legs = Legs(upstream, self.bridge, identity, connections)
        self.sessions = sessions
        self.identity = identity
        self.connections = connections
        self.sideband = Sideband(upstream, sessions, spawn)
        self.names = names.Names()  # what each plain upstream lists
        self.max_response_bytes = max_response_bytes  # a fresh list, at most

    # -- a call --------------------------------------------------------------------------

    async def call(self, route: UpstreamRoute, headers: Mapping[str, str], msg: McpMessage,
                   session: Session | None, ctx: CallContext, into: Forwarded,
                   chain: Chain | None = None) -> None:
        """Forward the call; `into` holds the leg from the moment it is chosen (so a call
        cancelled while it waits can tell its upstream on the right session) and, at the end,
        the upstream's 2xx answer. `chain`: the call came to the upstream's own endpoint with
        these policies, and where they hide names from the caller, the tool and prompt names
        are learned and checked here (`proxy.mcp.names`; a virtual endpoint has its own)."""
        if chain is not None and msg.method in names.CALLS:
            await self._known(route, headers, msg, session, ctx, chain)
        leg = into.leg = await self.legs.choose(route, headers, msg, session, ctx)
        leg.route = route
        if leg.local is not None:
            return
        response = await self._send(route, leg, msg)
        try:
            retried = await self._retry(route, headers, msg, session, ctx, leg, response)
        except BaseException:
            await response.aclose()
            raise
        if retried is not None:
            into.leg, answer = retried
            into.leg.route = route
            if answer is None:
                return
            response = answer
        await self.sideband.check_status(response, session, call_id=msg.id,
                                         modern=ctx.era == "modern")
        into.response = response
        if chain is not None and msg.method in names.LISTS \
                and chain.hides(msg, ctx):  # names hidden from this caller: learned
            into.leg.learn = self.names.reader(self._identity(route, ctx, msg.method), msg)

    # -- the names an upstream has ---------------------------------------------------------

    async def _known(self, route: UpstreamRoute, headers: Mapping[str, str], msg: McpMessage,
                     session: Session | None, ctx: CallContext, chain: Chain) -> None:
        """Return when the named tool or prompt may be the upstream's; raise the answer a
        hidden one gets (`InvalidParams`, audited as an error with that message) when a
        whole list, fresh if the name was not on the last, does not name it. A name the
        gateway cannot decide on (no whole list to be had) goes on, and so does any name
        where the policies hide none from this caller (nothing for an answer to give away:
        the upstream answers as it always did)."""
        kind, listing = names.CALLS[msg.method or ""]
        name = (msg.params or {}).get("name")
        if not isinstance(name, str):
            return  # malformed: the upstream answers it
        identity = self._identity(route, ctx, listing)
        known = self.names.known(identity, name)
        if known:
            return
        # cannot tell yet and not to look now: goes on (the cheap checks first: the rules'
        # `hides` are asked only when a look, or a refusal, may follow)
        looking = self.names.may_look(identity, ctx.principal.key, ctx.clock())
        if (known is None and not looking) or not chain.hides(_LISTING[listing], ctx):
            return
        if looking:
            await self.names.look(identity, lambda: self._list_afresh(
                route, headers, msg, session, ctx, listing, identity))
        if self.names.known(identity, name) is False:
            raise InvalidParams(names.unknown(kind, name))

    def _identity(self, route: UpstreamRoute, ctx: CallContext, listing: str
                  ) -> names.Identity:
        """Whose list a name is looked up in: the upstream's (a per-caller URL's resolved
        one has its own state key), and the caller's own where the upstream may list other
        names to another caller."""
        per_caller = route.local or route.identity != "none" or (
            self.connections is not None and route.name in self.connections.upstreams)
        return self.names.identity(route.state_key, ctx.principal.key if per_caller else None,
                                   names.LISTS[listing][0])

    async def _list_afresh(self, route: UpstreamRoute, headers: Mapping[str, str], msg: McpMessage,
                           session: Session | None, ctx: CallContext, listing: str,
                           identity: names.Identity) -> None:
        """The upstream's whole list, asked for as this caller on this caller's leg (its
        session, its token), every page followed up to MAX_PAGES, and learned. A failure is
        logged: the names stay as they were."""
        key = names.LISTS[listing][1]
        found: list[str] = []
        cursor: str | None = None
        try:
            for _ in range(names.MAX_PAGES):
                lheaders, lmsg = _listing(headers, msg, listing, cursor)
                into = Forwarded(Leg([]))
                await self.call(route, lheaders, lmsg, session, ctx, into)
                if into.response is None:  # answered by the gateway: not the upstream's
                    return
                result = await self._result(into.response, lmsg.id)
                listed = names.listed_names(result, key)
                if listed is None:  # not a list: nothing to tell unknown names by
                    return
                found += listed
                nxt = result.get("nextCursor")
                if not (isinstance(nxt, str) and nxt):
                    self.names.learn(identity, found, whole=True)
                    return
                cursor = nxt
            self.names.learn(identity, found, whole=False)
        except GatewayError as exc:
            log.info("%s: no fresh %s to look a name up in: %s", route.name, listing, exc)

    async def _result(self, response: UpstreamAnswer, request_id: Any) -> dict[str, Any]:
        """The result of a request the gateway made itself, from its JSON or SSE answer
        (closed here); an error answer is an `UpstreamFailure`."""
        try:
            if response.headers.get("content-type", "").startswith("text/event-stream"):
                return await result_from_stream(response, request_id, self.max_response_bytes)
            if not response.headers.get("content-type", "").startswith("application/json"):
                raise UpstreamProtocolError("upstream sent an unexpected content type")
            data, _ = await read_head(response, 0, self.max_response_bytes)
        finally:
            await response.aclose()
        try:
            return _result_of(orjson.loads(data), request_id)
        except orjson.JSONDecodeError:
            raise UpstreamProtocolError() from None

    async def _send(self, route: UpstreamRoute, leg: Leg, msg: McpMessage) -> UpstreamAnswer:
        headers, body = leg.headers, leg.body or msg.body
        trace = CURRENT.get()
        if trace is not None:  # tracing on: the context goes in the headers and in _meta
            headers, body = trace.upstream(route, msg, headers, body)
        return await self.upstream.open(route, "POST", headers, body)

    async def _retry(self, route: UpstreamRoute, headers: Mapping[str, str], msg: McpMessage,
                     session: Session | None, ctx: CallContext, leg: Leg,
                     response: UpstreamAnswer) -> tuple[Leg, UpstreamAnswer | None] | None:
        """The call again when its first answer calls for it (see the module docstring);
        None when the first answer stands. The first answer is closed before a retry."""
        status = response.status_code
        fresh = None
        if leg.bridged and status == 404:  # the upstream forgot the session held for the caller
            await response.aclose()
            await self.bridge.forget(route, ctx.principal.key)
        elif status == 401 and leg.bearer is not None and self.connections is not None:
            await response.aclose()  # this person's upstream token was refused: refresh once
            fresh = await self.connections.refresh(route.name, ctx.principal.key, leg.bearer)
        elif msg.method == "initialize" and status >= 400 and await self.legs.modern_only(route):
            await response.aclose()  # a 2026-07-28-only upstream refused a legacy opening
            return await self.legs.choose(route, headers, msg, session, ctx), None
        else:
            return None
        leg = await self.legs.choose(route, headers, msg, session, ctx, fresh)
        return leg, await self._send(route, leg, msg)

    @staticmethod
    def must_hold(msg: McpMessage, rewrite: Rewrite | None) -> bool:
        """THE hook point for "this answer must be held whole and rewritten": True when a
        result rewrite is due (`rewrite`: the policies' `Chain.rewriter`, access profiles and
        result guardrails, with what `Leg.rewrite` adds for a bridge), or the gateway learns
        from the answer (a tools/list: metrics, a per-user upstream's last list; a filtered
        tools/list or prompts/list: the names the upstream has, `Leg.learn`). A held answer is bounded by
        `server.max_response_bytes`; any other answer streams through as it arrives, at any
        size, its id and outcome read on the way (`proxy.mcp.scan`)."""
        return rewrite is not None or msg.method == "tools/list"

    async def json_body(self, forwarded: Forwarded, *, held: bool, limit: int, head: int
                        ) -> tuple[bytes, BodyChunks | None]:
        """The JSON answer's body: whole (up to `limit` when `held`, else when it ends within
        `head` bytes), or its first bytes and the rest to stream."""
        response = forwarded.response
        assert response is not None
        if not response.headers.get("content-type", "").startswith("application/json"):
            raise UpstreamProtocolError("upstream sent an unexpected content type")
        return await read_head(response, head, limit if held else None)

    def json_answer(self, route: UpstreamRoute, msg: McpMessage, forwarded: Forwarded,
                    rewrite: Rewrite | None, data: bytes) -> tuple[bytes, str | None]:
        """The upstream's whole JSON answer to this call, rewritten when a policy or the bridge
        has something to change in it, and its error for the audit log (None when a result)."""
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError:
            raise UpstreamProtocolError() from None
        outcome = response_outcome(obj, msg.id)
        if outcome is None:
            raise UpstreamProtocolError()
        ok, error = outcome
        if not ok:
            return data, error
        self._remember(route, forwarded.leg, msg, obj)
        if rewrite is not None and isinstance(obj.get("result"), dict) and rewrite(obj["result"]):
            data = orjson.dumps(obj)
        return data, None

    def _remember(self, route: UpstreamRoute, leg: Leg, msg: McpMessage,
                  obj: dict[str, Any]) -> None:
        """The last tools/list this upstream gave a connected person, before any per-caller
        filtering: what a person not yet connected is shown (filtered for them)."""
        if leg.bearer is not None and msg.method == "tools/list" and \
                self.connections is not None and isinstance(obj.get("result"), dict):
            self.connections.last_lists[(route.state_key, "tools/list")] = copy.deepcopy(
                obj["result"])

    # -- the spine's view of a plain upstream (proxy.mcp.forwarding) ----------------------

    relays_client_cancel = True  # a client's notifications/cancelled goes on by one_way

    async def check(self, route: UpstreamRoute, chain: Chain, msg: McpMessage,
                    ctx: CallContext) -> CallContext:
        await chain.run(msg, ctx)
        if msg.method == "tasks/list" and ctx.task is not None and ctx.task.owned:
            await tasks.usable(ctx, chain)  # the tasks of tools still the caller's to use
        return ctx

    async def usable_tasks(self, route: UpstreamRoute, chain: Chain, ctx: CallContext
                           ) -> None:
        await tasks.usable(ctx, chain)

    def views(self, route: UpstreamRoute, leg: Leg, session: Session | None,
              ctx: CallContext) -> tuple[bool, Outgoing | None]:
        """A legacy upstream's request to a 2026-07-28 caller ends the call: nothing can
        carry the question. Nothing else is viewed on the way."""
        return leg.bridged, None

    def resumable(self, leg: Leg) -> bool:
        """The upstream's own stream reaches the client (no bridge): the client may resume
        it with Last-Event-ID."""
        return not leg.bridged

    # -- no call to answer: the sideband (proxy.mcp.sideband) ------------------------------

    async def one_way(self, route: UpstreamRoute, headers: Mapping[str, str], msg: McpMessage,
                      session: Session | None, ctx: CallContext) -> None:
        await self.sideband.one_way(route, headers, msg, session, ctx)

    async def listen(self, route: UpstreamRoute, headers: Mapping[str, str],
                     session: Session | None, principal: Principal, draining: bool
                     ) -> Listened | NoStream:
        return await self.sideband.listen(route, headers, session, draining)

    async def end(self, route: UpstreamRoute, headers: Mapping[str, str], session: Session
                  ) -> dict[str, str] | None:
        return await self.sideband.end(route, headers, session)

    def notify_cancelled(self, route: UpstreamRoute, leg: Leg, request_id: Any,
                         reason: str) -> None:
        self.sideband.notify_cancelled(route, leg, request_id, reason)

    # -- a session the bridge holds for a caller (a virtual endpoint's member) -------------

    async def era_of(self, route: UpstreamRoute) -> str:
        """The era the upstream speaks (learned once, when configured `auto`)."""
        return route.era if route.era != "auto" else await self.bridge.era(route)

    async def answer_held(self, route: UpstreamRoute, principal: Principal, body: bytes
                          ) -> int | None:
        """A client's answer sent on, on the session held for `principal`: the upstream's
        HTTP status, or None when no session is held (the request went with it)."""
        extra = [*(self.identity.headers(route, principal) or []),
                 *person_header(route, principal)]  # a local member binds answers to it
        return await self.bridge.answer(route, principal.key, body, extra)

    async def listen_held(self, route: UpstreamRoute, principal: Principal, holder: str
                          ) -> UpstreamAnswer | None:
        """The GET stream on the session held for `holder` (opened now if none is), as
        `principal`; None for a stateless upstream (no stream to listen on)."""
        return await self.bridge.listen(route, holder, self.identity.headers(route, principal))

    async def end_held(self, route: UpstreamRoute, holder: str) -> None:
        """Forget the session held for `holder`, and end it upstream."""
        await self.bridge.end(route, holder)

# what the policies are asked whether they hide names from a caller's list (by its method)
_LISTING = {method: McpMessage("request", None, method, None, b"") for method in names.LISTS}


def _listing(headers: Mapping[str, str], msg: McpMessage, method: str, cursor: str | None
             ) -> tuple[dict[str, str], McpMessage]:
    """A list request the gateway sends for a caller's call `msg`, in the call's era: its
    protocol version and envelope (no progress token), under an id of the gateway's own."""
    params: dict[str, Any] = {}
    meta = (msg.params or {}).get("_meta")
    if isinstance(meta, dict):
        params["_meta"] = {k: v for k, v in meta.items() if k != "progressToken"}
    if cursor:
        params["cursor"] = cursor
    request_id = f"tollhouse-{secrets.token_urlsafe(12)}"
    body = orjson.dumps({"jsonrpc": "2.0", "id": request_id, "method": method,
                         "params": params})
    sent = {k: v for k in ("content-type", "mcp-protocol-version")
            if (v := headers.get(k)) is not None}
    if headers.get("mcp-method") is not None:  # a 2026-07-28 request mirrors its method
        sent["mcp-method"] = method
    return sent, McpMessage("request", request_id, method, params, body)


def _result_of(obj: Any, request_id: Any) -> dict[str, Any]:
    outcome = response_outcome(obj, request_id)
    if outcome is None:
        raise UpstreamProtocolError()
    ok, error = outcome
    if not ok:
        raise UpstreamFailure(f"upstream answered an error: {(error or '')[:200]}")
    result = obj.get("result")
    if not isinstance(result, dict):
        raise UpstreamProtocolError()
    return result


async def result_from_stream(response: UpstreamAnswer, request_id: Any, limit: int
                             ) -> dict[str, Any]:
    """The result of a request the gateway made itself, from the upstream's SSE answer:
    read whole (up to `limit`), the event that answers `request_id` found in it."""
    data, _ = await read_head(response, 0, limit)
    for event in EventSplitter().feed(data + b"\n\n"):
        raw = event_data(event)
        if not raw:
            continue
        try:
            obj = orjson.loads(raw)
        except orjson.JSONDecodeError:
            continue
        if response_outcome(obj, request_id) is not None:
            return _result_of(obj, request_id)
    raise UpstreamProtocolError()
