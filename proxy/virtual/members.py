"""A virtual endpoint's members as it reaches them: each member's route as this endpoint uses
it (its era settled, its held sessions its own: per endpoint and caller, and per gateway
session for a legacy client, whose member sessions declare what that client declared), the
member's view of a call's context, the request as the member receives it, and a legacy
client's DELETE passed on to every member.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Mapping
from typing import Any

import orjson

from proxy.chain import CallContext
from proxy.errors import GatewayError, UpstreamUnavailable
from proxy.jsonrpc import McpMessage
from proxy.mcp import bridge, eras
from proxy.mcp.forward import Forwarder
from proxy.state import Session
from proxy.upstream import UpstreamRoute
from proxy.virtual.route import VirtualRoute

log = logging.getLogger("tollhouse.virtual")

RELAYED = ("sampling", "elicitation", "roots")  # a client's capabilities a member may use
# the client extensions relayed too: MCP Apps needs nothing of the gateway but what it carries
# (tools' _meta and resources), so a member may see that the client renders its UI
RELAYED_EXTENSIONS = ("io.modelcontextprotocol/ui",)


class Members:
    """The members of every virtual endpoint, read from the spine's live table per call."""

    def __init__(self, forward: Forwarder, routes: Mapping[str, UpstreamRoute]) -> None:
        self.forward = forward
        self.routes = routes  # the spine's live table: members are read from it per call

    def served(self, name: str) -> bool:
        """Whether a member is registered now (one registered or removed through
        /api/v1/servers joins or leaves the endpoints that name it)."""
        return name in self.routes

    def registered(self, name: str) -> UpstreamRoute:
        """The member's route as registered (KeyError when it is not)."""
        return self.routes[name]

    def present(self, members: tuple[str, ...]) -> tuple[str, ...]:
        """The members served now, in the endpoint's order."""
        return tuple(name for name in members if name in self.routes)

    async def route(self, route: VirtualRoute, name: str, session: Session | None
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

    async def end(self, route: VirtualRoute, session: Session) -> None:
        """A legacy client's DELETE: the member sessions held for its gateway session are
        ended too (best effort: a member that fails keeps its session until it expires)."""
        await asyncio.gather(*(self._end_one(route, name, session)
                               for name in route.members if name in self.routes))

    async def _end_one(self, route: VirtualRoute, name: str, session: Session) -> None:
        try:
            member = await self.route(route, name, session)
            await self.forward.end_held(member, session.principal_key)
        except GatewayError as exc:
            log.info("/mcp/%s: could not end the session at member %s: %s", route.name, name,
                     exc)


def context(ctx: CallContext, member: UpstreamRoute, *, leg: bool = False) -> CallContext:
    """The member's view of the call: for its policies (the caller's era), or for the
    Forwarder (`leg`: always 2026-07-28, so a legacy member's session is held for this
    endpoint and caller by the bridge, and a 2026-07-28 member is spoken to directly)."""
    return CallContext(ctx.principal, member.name, member.url_text,
                       era="modern" if leg else ctx.era,
                       session_hash=ctx.session_hash, arguments_size=ctx.arguments_size,
                       api_key_id=ctx.api_key_id, peer_ip=ctx.peer_ip, headers=ctx.headers,
                       clock=ctx.clock, recheck=ctx.recheck)


def outbound(msg: McpMessage, name: str | None, session: Session | None
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


def _relayed(envelope: dict[str, Any] | None) -> dict[str, Any]:
    """What a legacy client declared in its initialize (kept with its gateway session, in the
    shared state), as far as the gateway relays it: the requests a member may send it, the
    MCP Apps extension, and no notice from the client (roots' listChanged: a member is sent
    none)."""
    declared = envelope.get(eras.CLIENT_CAPS) if envelope is not None else None
    if not isinstance(declared, dict):
        return {}
    out = {key: declared[key] for key in RELAYED if isinstance(declared.get(key), dict)}
    if "roots" in out:
        out["roots"] = {k: v for k, v in out["roots"].items() if k != "listChanged"}
    extensions = declared.get("extensions")
    if isinstance(extensions, dict):
        relayed = {key: extensions[key] for key in RELAYED_EXTENSIONS
                   if isinstance(extensions.get(key), dict)}
        if relayed:
            out["extensions"] = relayed
    return out
