"""The leg a call takes to a plain upstream: the headers (the caller's identity, a person's own
upstream token, a local process's person), the upstream session, and the bridge between the
eras on the way. `Legs.choose` picks it; `Leg` is what it picked, and what the bridge does to
the result (`Leg.rewrite`)."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from proxy.auth.principal import Principal
from proxy.chain import CallContext, Rewrite
from proxy.connect import links
from proxy.connect.manager import Connections, UpstreamNotConnected
from proxy.errors import GatewayError, MethodNotFound
from proxy.jsonrpc import McpMessage
from proxy.mcp import bridge, eras
from proxy.mcp.bridge import Bridge
from proxy.state import Session
from proxy.upstream import UpstreamClient, UpstreamRoute
from proxy.upstream.identity import IdentityForwarder
from proxy.upstream.stdio import PERSON_HEADER


@dataclass(slots=True)
class Leg:
    """How one call reaches its upstream: the headers, the upstream session (if any), and
    whether the gateway bridges the eras on the way."""

    headers: list[tuple[str, str]]
    upstream_session_id: str | None = None
    protocol_version: str | None = None
    bridged: bool = False  # a 2026-07-28 caller on a legacy upstream
    notify: bool = True  # a legacy upstream learns of a cancellation by notification
    local: dict[str, Any] | None = None  # a result the gateway answers itself
    body: bytes | None = None  # the request as the upstream needs it, when not as sent
    to_legacy_client: bool = False  # a legacy client bridged onto a 2026-07-28-only upstream
    # a bridged leg whose result goes to a legacy client after all (a virtual endpoint speaks
    # to a legacy member as a 2026-07-28 caller would, for a client of either era): as it is
    legacy_result: bool = False
    bearer: str | None = None  # this person's own upstream token (per_user upstreams)
    route: UpstreamRoute | None = None  # where it went (a virtual endpoint's member)
    learn: Rewrite | None = None  # a list's reader, before any rule filters it (names.py)
    # what the client is shown in place of the upstream's own, once the policies have read
    # and rewritten the result (a virtual endpoint's member URIs: proxy/virtual/uris.py)
    shown: Rewrite | None = None
    # a legacy upstream's initialize result, when the leg answered server/discover from it (a
    # virtual endpoint reads the 2025-11-25 capabilities discover leaves out: tasks)
    initialized: dict[str, Any] | None = None

    def rewrite(self, rewrite: Rewrite | None, method: str | None) -> Rewrite | None:
        """The policies' result rewrite, plus what this leg's bridge does to a result (and,
        first, what the gateway learns from it; last, what the client is shown instead)."""
        rewrite = then(after(self.learn, rewrite), self.shown)
        if self.bridged and not self.legacy_result:
            return _with_completion(rewrite, method)
        if self.to_legacy_client:
            return _refusing_input(rewrite)
        return rewrite


class Legs:
    """Chooses each call's leg (see the module docstring)."""

    def __init__(self, upstream: UpstreamClient, bridge_: Bridge, identity: IdentityForwarder,
                 connections: Connections | None) -> None:
        self.upstream = upstream
        self.bridge = bridge_
        self.identity = identity
        self.connections = connections

    async def choose(self, route: UpstreamRoute, headers: Mapping[str, str], msg: McpMessage,
                   session: Session | None, ctx: CallContext, bearer: str | None = None
                   ) -> Leg:
        identity = self.identity.headers(route, ctx.principal)
        if route.local:  # a local process: chosen per person (per_user), answers bound to them
            identity = [*(identity or []), *person_header(route, ctx.principal)]
        if self.connections is None or route.name not in self.connections.upstreams:
            return await self._route_leg(route, headers, msg, session, ctx, identity)
        try:
            bearer = bearer or await self.connections.access_token(route.name,
                                                                   ctx.principal.key)
        except UpstreamNotConnected as exc:
            last = self.connections.last_lists.get((route.state_key, msg.method or ""))
            if last is not None:  # clients can still discover the tools
                return Leg([], local=copy.deepcopy(last))
            return await self._connect_prompt(exc, route, msg, session, ctx)
        identity = [*(identity or []), ("authorization", f"Bearer {bearer}")]
        answered = ctx.era == "modern" and links.answers_link(msg.params)
        if answered:  # a retry after the connect link: its answer to the gateway taken out
            msg = _without_link_answer(msg)
        leg = await self._route_leg(route, headers, msg, session, ctx, identity)
        if answered and leg.body is None:
            leg.body = msg.body
        leg.bearer = bearer
        return leg

    async def _connect_prompt(self, exc: UpstreamNotConnected, route: UpstreamRoute,
                              msg: McpMessage, session: Session | None, ctx: CallContext
                              ) -> Leg:
        """A caller not connected to a per_user upstream: seed 004's -32000 hint, or, for a
        client that declared URL-mode elicitation, a connect link (proxy.connect.links):
        -32042 in 2025-11-25, an input_required result in 2026-07-28."""
        assert self.connections is not None
        issuer = self.connections.links
        if issuer is None or not _url_elicitation(msg, session, ctx):
            raise exc
        elicitation = await issuer.issue(route.name, ctx.principal.key,
                                         links.prompt(exc, route.name))
        if ctx.era == "legacy":
            raise links.UrlElicitationRequired(exc, elicitation) from None
        ctx.audit_note = "; ".join(filter(None, (
            ctx.audit_note, f"{exc.audit_name}: connect link sent (input_required)")))
        return Leg([], local=links.input_required(elicitation))

    async def _route_leg(self, route: UpstreamRoute, headers: Mapping[str, str], msg: McpMessage,
                         session: Session | None, ctx: CallContext,
                         identity: list[tuple[str, str]] | None) -> Leg:
        if ctx.era == "legacy":
            if msg.method == "initialize" and await self.bridge.modern_only(route):
                discover = await self.bridge.discover(route)
                return Leg([], local=bridge.initialize_from_discover(
                    discover, (msg.params or {}).get("protocolVersion"), route.name))
            if session is not None and session.bridged_envelope is not None:
                return self._to_modern(route, msg, session, identity)
            usid = session.upstream_session_id if session else None
            return Leg(self.upstream.headers(route, headers, usid, extra=identity), usid,
                       session.protocol_version if session else None)
        if await self.bridge.era(route) == "modern":
            return Leg(self.upstream.headers(route, headers, None, extra=identity,
                                             modern=True), notify=False)
        return await self._to_legacy(route, msg, ctx, identity)

    async def _to_legacy(self, route: UpstreamRoute, msg: McpMessage, ctx: CallContext,
                         identity: list[tuple[str, str]] | None) -> Leg:
        """A 2026-07-28 caller on a legacy upstream, on the session the gateway holds for this
        caller. Only the legacy era goes on: no 2026-only header, no envelope (a legacy-only
        server may refuse any request that claims a later revision)."""
        if msg.method == "subscriptions/listen":
            raise MethodNotFound(data={"method": msg.method})
        held = await self.bridge.session(route, ctx.principal.key, identity)
        if msg.method == "server/discover":
            return Leg([], local=eras.discover_from_initialize(held.initialize_result,
                                                                route.name),
                       initialized=held.initialize_result)
        usid = held.upstream_session_id
        headers = self.upstream.headers(route, {"content-type": "application/json"}, usid,
                                        extra=identity)
        headers.append(("mcp-protocol-version", bridge.LEGACY_VERSION))
        return Leg(headers, usid, bridge.LEGACY_VERSION, bridged=True,
                   body=bridge.without_envelope(msg))

    def _to_modern(self, route: UpstreamRoute, msg: McpMessage, session: Session,
                   identity: list[tuple[str, str]] | None) -> Leg:
        """A legacy client's request, sent on as a 2026-07-28 request: envelope and headers."""
        if msg.method == "ping":
            return Leg([], local={})
        assert session.bridged_envelope is not None
        extra = [("mcp-protocol-version", eras.MODERN_VERSIONS[0]),
                 ("mcp-method", msg.method or "")]
        named = eras.NAMED.get(msg.method or "")
        target = (msg.params or {}).get(named) if named else None
        if isinstance(target, str):
            extra.append(("mcp-name", bridge.encode_header(target)))
        headers = self.upstream.headers(route, {"content-type": "application/json"}, None,
                                        extra=[*extra, *(identity or [])])
        body = bridge.with_envelope(msg.body, bridge.envelope_for(session.bridged_envelope))
        return Leg(headers, notify=False, body=body, to_legacy_client=True)

    async def modern_only(self, route: UpstreamRoute) -> bool:
        """The upstream speaks only 2026-07-28 (so a legacy initialize it refused is answered
        from its discover): learned, and marked so."""
        try:
            if await self.bridge.era(route) != "modern":
                return False
        except GatewayError:
            return False
        await self.bridge.mark_modern_only(route)
        return True


def after(seen: Rewrite | None, rewrite: Rewrite | None) -> Rewrite | None:
    """`rewrite`, with `seen` reading the result first (a rewrite that changes nothing)."""
    if seen is None or rewrite is None:
        return seen or rewrite

    def both(result: dict[str, Any]) -> bool:
        seen(result)
        return rewrite(result)

    return both


def then(rewrite: Rewrite | None, last: Rewrite | None) -> Rewrite | None:
    """`rewrite`, then `last` (True: either changed the result)."""
    if rewrite is None or last is None:
        return rewrite or last

    def both(result: dict[str, Any]) -> bool:
        changed = rewrite(result)
        return last(result) or changed

    return both


def _refusing_input(rewrite: Rewrite | None) -> Rewrite:
    def refuse(result: dict[str, Any]) -> bool:
        bridge.refuse_input_required(result)
        return rewrite(result) if rewrite is not None else False

    return refuse


def _with_completion(rewrite: Rewrite | None, method: str | None) -> Rewrite:
    def complete(result: dict[str, Any]) -> bool:
        if rewrite is not None:
            rewrite(result)
        return bridge.complete(result, method)

    return complete


def _url_elicitation(msg: McpMessage, session: Session | None, ctx: CallContext) -> bool:
    """Whether the client declared URL-mode elicitation: in this request's envelope
    (2026-07-28), in this initialize, or at its session's initialize (2025-11-25)."""
    params = msg.params or {}
    if ctx.era == "modern":
        meta = params.get("_meta")
        caps = meta.get(eras.CLIENT_CAPS) if isinstance(meta, dict) else None
    elif msg.method == "initialize":
        caps = params.get("capabilities")
    else:
        caps = session.capabilities if session is not None else None
    elicitation = caps.get("elicitation") if isinstance(caps, dict) else None
    return isinstance(elicitation, dict) and isinstance(elicitation.get("url"), dict)


def _without_link_answer(msg: McpMessage) -> McpMessage:
    """A 2026-07-28 retry as the upstream takes it: the gateway's requestState and input
    response out (proxy.connect.links.without_answer)."""
    params = links.without_answer(msg.params or {})
    body = orjson.dumps({"jsonrpc": "2.0", "id": msg.id, "method": msg.method,
                         "params": params})
    return dataclasses.replace(msg, params=params, body=body)


def person_header(route: UpstreamRoute, principal: Principal) -> list[tuple[str, str]]:
    """For a local process, who the caller is (proxy.upstream.stdio chooses a per_user process
    by it, and takes an answer to a server request only from the person asked)."""
    return [(PERSON_HEADER, principal.key)] if route.local else []
