"""How one call reaches its upstream: the headers, the upstream session, and the bridges
between protocol eras (a 2026-07-28 caller on a legacy upstream, a legacy caller on a
2026-07-28-only upstream) and onto a person's own upstream account. The gateway's spine picks
a leg for each call here and forwards along it."""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from proxy import bridge, eras
from proxy.auth.principal import Principal
from proxy.bridge import Bridge
from proxy.chain import CallContext
from proxy.connect.manager import Connections, UpstreamNotConnected
from proxy.errors import GatewayError, MethodNotFound
from proxy.exchange import EdgeRequest, EdgeResponse
from proxy.jsonrpc import McpMessage
from proxy.state import InFlightRegistry, Session
from proxy.upstream import UpstreamClient, UpstreamRoute
from proxy.upstream.identity import IdentityForwarder

CLIENT_CANCELLED = "cancelled by the client"


@dataclass(slots=True)
class Leg:
    """How one call reaches its upstream: the headers, the upstream session (if any), and
    whether the gateway bridges a 2026-07-28 caller onto a legacy upstream."""

    headers: list[tuple[str, str]]
    upstream_session_id: str | None = None
    protocol_version: str | None = None
    bridged: bool = False
    notify: bool = True  # a legacy upstream learns of a cancellation by notification
    local: dict[str, Any] | None = None  # a result the gateway answers itself
    body: bytes | None = None  # the request as the upstream needs it, when not as sent
    to_legacy_client: bool = False  # a legacy client bridged onto a 2026-07-28-only upstream
    bearer: str | None = None  # this person's own upstream token (per_user upstreams)


class Legs:
    """The leg-choosing half of the gateway (a mixin: Gateway provides the attributes)."""

    upstream: UpstreamClient
    bridge: Bridge
    identity: IdentityForwarder
    connections: Connections | None
    inflight: InFlightRegistry

    async def _leg(self, route: UpstreamRoute, req: EdgeRequest, msg: McpMessage,
                   session: Session | None, ctx: CallContext, bearer: str | None = None
                   ) -> Leg:
        identity = self.identity.headers(route, ctx.principal)
        if self.connections is not None and route.name in self.connections.upstreams:
            try:
                bearer = bearer or await self.connections.access_token(route.name,
                                                                       ctx.principal.key)
            except UpstreamNotConnected:
                last = self.connections.last_lists.get((route.name, msg.method or ""))
                if last is not None:  # clients can still discover the tools
                    return Leg([], local=copy.deepcopy(last))
                raise
            identity = [*(identity or []), ("authorization", f"Bearer {bearer}")]
            leg = await self._route_leg(route, req, msg, session, ctx, identity)
            leg.bearer = bearer
            return leg
        return await self._route_leg(route, req, msg, session, ctx, identity)

    async def _route_leg(self, route: UpstreamRoute, req: EdgeRequest, msg: McpMessage,
                         session: Session | None, ctx: CallContext,
                         identity: list[tuple[str, str]] | None) -> Leg:
        if ctx.era == "legacy":
            if msg.method == "initialize" and self.bridge.modern_only(route):
                discover = await self.bridge.discover(route)
                return Leg([], local=bridge.initialize_from_discover(
                    discover, (msg.params or {}).get("protocolVersion"), route.name))
            if session is not None and session.bridged_envelope is not None:
                return self._to_modern(route, msg, session, identity)
            usid = session.upstream_session_id if session else None
            return Leg(self.upstream.headers(route, req.headers, usid, extra=identity), usid,
                       session.protocol_version if session else None)
        if await self.bridge.era(route) == "modern":
            return Leg(self.upstream.headers(route, req.headers, None, extra=identity,
                                             modern=True), notify=False)
        # a 2026-07-28 caller on a legacy upstream: the gateway's session for this caller
        if msg.method == "subscriptions/listen":
            raise MethodNotFound(data={"method": msg.method})
        usid = await self.bridge.session(route, ctx.principal.key, identity)
        if msg.method == "server/discover":
            init = self.bridge.initialize_result(route) or {}
            return Leg([], local=eras.discover_from_initialize(init, route.name))
        # only the legacy era goes on: no 2026-only header, no envelope (a legacy-only server
        # may refuse any request that claims a later revision)
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

    async def _modern_only(self, route: UpstreamRoute) -> bool:
        try:
            if await self.bridge.era(route) != "modern":
                return False
        except GatewayError:
            return False
        self.bridge.mark_modern_only(route)
        return True

    async def _modern_notification(self, route: UpstreamRoute, msg: McpMessage,
                                   principal: Principal, session: Session | None
                                   ) -> EdgeResponse:
        """A notification bound for a 2026-07-28 upstream is answered here, which has no use
        for one: a cancel naming one of this caller's calls in flight ends it (and closes its
        upstream request); anything else is acknowledged and changes nothing."""
        target_id = msg.params.get("requestId") if msg.params is not None else None
        if msg.method == "notifications/cancelled" and isinstance(target_id, (str, int)):
            await self.inflight.cancel(
                (route.name, principal.key, session.id if session else "", target_id),
                CLIENT_CANCELLED)
        headers = {"Mcp-Session-Id": session.id} if session is not None else {}
        return EdgeResponse(202, headers)


def refusing_input(rewrite: Callable[[dict[str, Any]], bool] | None
                    ) -> Callable[[dict[str, Any]], bool]:
    def refuse(result: dict[str, Any]) -> bool:
        bridge.refuse_input_required(result)
        return rewrite(result) if rewrite is not None else False

    return refuse


def with_completion(rewrite: Callable[[dict[str, Any]], bool] | None, method: str | None
                     ) -> Callable[[dict[str, Any]], bool]:
    def complete(result: dict[str, Any]) -> bool:
        if rewrite is not None:
            rewrite(result)
        return bridge.complete(result, method)

    return complete
