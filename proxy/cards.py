"""MCP server cards (SEP-2127): each endpoint's card at `/mcp/<endpoint>/server-card` (the
location the SEP reserves, `<streamable-http-url>/server-card`) and the catalog of every
endpoint at `/.well-known/mcp/catalog.json`.

A card is the SEP's document (`$schema`, reverse-DNS `name`, `version`, `description`,
`remotes` with the endpoint's URL, its protocol versions and the Authorization header it
needs) plus, in `_meta` (the card's extension point; the card schema has no field for
primitives), what the gateway adds: `tollhouse/authorization` (whether a credential is
required, and the endpoint's protected resource metadata, RFC 9728) and `tollhouse/primitives`
(the tools, prompts and resources this caller could list).

What a card lists is built from what is stored, never from an upstream: each server's lists as
last seen (`server_tools`, proxy.seen, read again by a process after `STORED_S` or once it
stored a sighting of its own), filtered as
the gateway filters a list for this caller: the access rules and tool profiles
(policies.access) and the Cedar policies (`Gate.listable`); a virtual endpoint's members each
with their own rules, under the names the endpoint exposes, then the endpoint's own rules. The
caller is the one the request's credential names: no credential is an anonymous caller, who
can list nothing on an endpoint that requires one (its card lists nothing); a credential that
does not hold answers as the MCP edge answers it (401, 403, 429). A per-caller upstream lists
no primitives (its lists are each caller's own), nor a kind never listed since the table was
made (null). Guardrails' screening and pinning, which may hide a listed tool, are not applied.

Each answer carries a strong ETag (304 for If-None-Match) and `Cache-Control` (public for an
anonymous caller's card and the catalog, private for a caller's own, `Vary: Authorization`),
and the CORS headers the discovery document asks for.
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import orjson
from quart import Quart, Response, request

from proxy import __version__
from proxy.auth.peer import client_ip
from proxy.auth.principal import Principal
from proxy.chain import CallContext
from proxy.errors import GatewayError, HiddenTool, Unauthenticated
from proxy.held import held
from proxy.jsonrpc import McpMessage
from proxy.mcp import eras
from proxy.virtual import naming
from proxy.virtual.exposed import expose
from proxy.virtual.route import VirtualRoute
from proxy.web.routes import respond

if TYPE_CHECKING:
    from proxy.mcp.gateway import Gateway
    from proxy.seen import LastSeen
    from proxy.snapshot import Live

SCHEMA = "https://static.modelcontextprotocol.io/schemas/v2/server-card.schema.json"
CARD_TYPE = "application/mcp-server-card+json"
SUFFIX = "/server-card"
MAX_AGE_S = 60  # Cache-Control max-age of a card and of the catalog
STORED_S = 5.0  # how long a process reuses what it read of a server's stored lists
VERSIONS = (*eras.LEGACY_VERSIONS, *eras.MODERN_VERSIONS)  # what every endpoint speaks
CORS = {"Access-Control-Allow-Origin": "*", "Access-Control-Allow-Methods": "GET",
        "Access-Control-Allow-Headers": "Authorization, Content-Type"}
# kind -> (the list method, the field naming each item, the kind of name a virtual endpoint
# exposes it under)
KINDS = {"tools": ("tools/list", "name", "tool"), "prompts": ("prompts/list", "name", "prompt"),
         "resources": ("resources/list", "uri", "uri")}
_LABEL = re.compile(r"[^A-Za-z0-9-]")
Lists = dict[str, list[dict[str, Any]] | None]


@dataclass(frozen=True, slots=True)
class Viewer:
    """Who asks: `principal` None is an anonymous caller of an endpoint that requires a
    credential (who can list nothing there)."""

    principal: Principal | None
    peer: str | None


def namespace(public_url: str) -> str:
    """The reverse-DNS namespace of the gateway's cards: its public host's labels reversed
    (an address as it is)."""
    host = urlsplit(public_url).hostname or "localhost"
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return ".".join(_LABEL.sub("-", label) for label in reversed(host.split(".")) if label)
    return _LABEL.sub("-", host.replace(":", "-")).strip("-") or "localhost"


class Cards:
    """Builds the cards and the catalog; keeps what it read of the stored lists `STORED_S`."""

    def __init__(self, public_url: str, auth_required: bool,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.public_url = public_url.rstrip("/")
        self.auth_required = auth_required
        self.namespace = namespace(public_url)
        self.host = urlsplit(public_url).hostname or "localhost"
        self._clock = clock
        self._kept: dict[str, tuple[float, int, Lists]] = {}  # (until, writes, lists)

    def catalog(self, gateway: Gateway) -> dict[str, Any]:
        names = sorted({*gateway.mounts, *gateway.routes, *gateway.endpoints})
        return {"specVersion": "draft", "entries": [
            {"identifier": f"urn:air:{self.host}:{name}", "displayName": name,
             "type": CARD_TYPE, "url": f"{self.public_url}/mcp/{name}{SUFFIX}"}
            for name in names]}

    async def card(self, gateway: Gateway, seen: LastSeen | None, name: str,
                   viewer: Viewer) -> dict[str, Any]:
        route = gateway.route(name).route  # EndpointNotFound: 404
        if isinstance(route, VirtualRoute):
            listed = await self._virtual(gateway, seen, route, viewer)
            members = ", ".join(route.members)
            description = f"Tools of {len(route.members)} MCP servers in one: {members}"
        else:
            listed = await self._plain(gateway, seen, name, route, viewer)
            description = f"The MCP server {name}, through this gateway"
        remote: dict[str, Any] = {"type": "streamable-http",
                                  "url": f"{self.public_url}/mcp/{name}",
                                  "supportedProtocolVersions": list(VERSIONS)}
        authorization: dict[str, Any] = {"required": self.auth_required}
        if self.auth_required:
            remote["headers"] = [{
                "name": "Authorization", "isRequired": True, "isSecret": True,
                "description": "Bearer token: an access token for this endpoint (see its "
                               "protected resource metadata) or an API key"}]
            authorization["protectedResourceMetadata"] = \
                f"{self.public_url}/.well-known/oauth-protected-resource/mcp/{name}"
        return {"$schema": SCHEMA, "name": f"{self.namespace}/{name}", "version": __version__,
                "title": name[:100], "description": _cut(description, 100),
                "remotes": [remote],
                "_meta": {"tollhouse/authorization": authorization,
                          "tollhouse/primitives": {
                              "viewer": "anonymous" if viewer.principal is None
                              or viewer.principal.kind == "anonymous" else "caller",
                              **listed}}}

    # -- what a caller could list ------------------------------------------------------------

    async def _plain(self, gateway: Gateway, seen: LastSeen | None, name: str, route: Any,
                     viewer: Viewer) -> Lists:
        live = gateway.live
        if viewer.principal is None or _refused(live, name, viewer.principal):
            return {kind: [] for kind in KINDS}
        if getattr(route, "template", None) is not None or seen is None:
            return dict.fromkeys(KINDS)  # a per-caller upstream's lists are each caller's
        stored = (await self._stored(seen, [name]))[name]
        ctx = CallContext(viewer.principal, name, getattr(route, "url_text", ""),
                          peer_ip=viewer.peer)
        return {kind: None if items is None else _visible(live, ctx, kind, items)
                for kind, items in stored.items()}

    async def _virtual(self, gateway: Gateway, seen: LastSeen | None, route: VirtualRoute,
                       viewer: Viewer) -> Lists:
        live, principal = gateway.live, viewer.principal
        if principal is None or _refused(live, route.name, principal):
            return {kind: [] for kind in KINDS}
        members = [m for m in route.members if m in gateway.routes
                   and gateway.routes[m].template is None and not _refused(live, m, principal)]
        stored = await self._stored(seen, members) if seen is not None else {}
        ctx = CallContext(principal, route.name, "", peer_ip=viewer.peer, virtual=True)
        out: Lists = {}
        for kind, (_, field, exposed_as) in KINDS.items():
            merged: list[dict[str, Any]] = []
            taken: set[str] = set()
            known = False
            for member in members:
                items = stored.get(member, {}).get(kind)
                if items is None:
                    continue
                known = True
                mctx = CallContext(principal, member, gateway.routes[member].url_text,
                                   peer_ip=viewer.peer)
                for item in _visible(live, mctx, kind, items):
                    exposed = expose(route, exposed_as, member, item[field])
                    if exposed in taken or (exposed in route.aliases and await _alias_denied(
                            live, ctx, route, member, item[field])):
                        continue  # the first member keeps a name two share, as in a list
                    taken.add(exposed)
                    merged.append({**item, field: exposed})
            out[kind] = _visible(live, ctx, kind, merged) if known else None
        return out

    async def _stored(self, seen: LastSeen, servers: list[str]) -> dict[str, Lists]:
        """What is stored of each server's lists: read again after `STORED_S`, or at once
        once this process stored a sighting of its own (another replica's within STORED_S)."""
        await seen.flush()  # this process's own sightings are written: read them back
        now, mark = self._clock(), seen.writes
        stale = [s for s in servers if (kept := self._kept.get(s)) is None
                 or kept[0] <= now or kept[1] != mark]
        if stale:
            read = await seen.lists(stale)
            if len(self._kept) > 4096:
                self._kept.clear()
            for server in stale:
                self._kept[server] = (now + STORED_S, mark, read[server])
        return {s: self._kept[s][2] for s in servers}


def _refused(live: Live, endpoint: str, principal: Principal) -> bool:
    """Whether the endpoint's caller rules refuse `principal` every call (so every list)."""
    return live.access is not None and live.access.refusal(endpoint, principal) is not None


def _visible(live: Live, ctx: CallContext, kind: str, items: list[dict[str, Any]]
             ) -> list[dict[str, Any]]:
    """The items a list of `kind` would show `ctx`'s caller: the access rules' and tool
    profiles' rewrite of the list, then the Cedar policies' listing decision; each item
    without the fields it has none of."""
    method, field, _ = KINDS[kind]
    result = {kind: [{k: v for k, v in i.items() if v is not None} for i in items]}
    listing = McpMessage("request", None, method, {}, b"")
    rewrite = live.access.rewriter(listing, ctx) if live.access is not None else None
    if rewrite is not None:
        rewrite(result)
    listable = live.gate.listable(method, ctx) if live.gate is not None else None
    if listable is None:
        return result[kind]
    return [i for i in result[kind] if listable(i[field])]


async def _alias_denied(live: Live, ctx: CallContext, route: VirtualRoute, member: str,
                        tool: str) -> bool:
    """An aliased tool the endpoint's rules refuse by its namespaced name (as a list leaves
    it out, proxy.virtual.lists)."""
    if live.access is None:
        return False
    call = McpMessage("request", None, "tools/call",
                      {"name": naming.exposed(member, tool, route.separator)}, b"")
    try:
        await live.access.check(call, ctx)
    except HiddenTool:
        return True
    return False


def _cut(text: str, most: int) -> str:
    return text if len(text) <= most else text[:most - 1] + "…"


# -- the routes ----------------------------------------------------------------------------


def register(app: Quart, public_url: str, auth_required: bool) -> None:
    cards = Cards(public_url, auth_required)

    async def server_card(endpoint: str) -> Response:
        if request.method == "OPTIONS":
            return Response(b"", 204, CORS)
        services = held()
        gateway = services.edge_gateway()
        gateway.route(endpoint)  # an unknown endpoint: 404 before any credential is read
        try:
            viewer = await _viewer(gateway, endpoint, services.trusted)
        except GatewayError as exc:  # as the MCP edge answers this credential
            failed = respond(exc, "mcp")
            failed.headers.update(CORS)
            return failed
        api = services.api
        card = await cards.card(gateway, api.seen if api is not None else None, endpoint,
                                viewer)
        public = viewer.principal is None or viewer.principal.kind == "anonymous"
        return _answer(card, CARD_TYPE, public)

    async def catalog() -> Response:
        if request.method == "OPTIONS":
            return Response(b"", 204, CORS)
        return _answer(cards.catalog(held().edge_gateway()), "application/json", True)

    app.add_url_rule("/mcp/<endpoint>" + SUFFIX, "server_card", server_card,
                     methods=["GET", "OPTIONS"])
    app.add_url_rule("/.well-known/mcp/catalog.json", "mcp_catalog", catalog,
                     methods=["GET", "OPTIONS"])


async def _viewer(gateway: Gateway, endpoint: str, trusted: Any) -> Viewer:
    """The caller the request's credential names (None without one where one is needed);
    a credential that does not hold raises the edge's own error for it."""
    authorization = request.headers.get("authorization")
    forwarded = [(k, v) for k, v in request.headers.items()
                 if k.lower() in ("x-forwarded-for", "forwarded")]
    address = client_ip(request.remote_addr, forwarded, trusted)
    peer = str(address) if address is not None else request.remote_addr
    try:
        principal = await gateway.auth.authenticate(authorization, endpoint, peer)
    except Unauthenticated:
        if authorization is not None:
            raise
        return Viewer(None, peer)
    return Viewer(principal, peer)


def _answer(document: Mapping[str, Any], media_type: str, public: bool) -> Response:
    body = orjson.dumps(document)
    etag = '"' + hashlib.sha256(body).hexdigest()[:32] + '"'
    headers = {"Content-Type": media_type, "ETag": etag, "Vary": "Authorization",
               "Cache-Control": f"{'public' if public else 'private'}, max-age={MAX_AGE_S}",
               **CORS}
    wanted = request.headers.get("if-none-match", "")
    if etag in (t.strip() for t in wanted.split(",")) or wanted.strip() == "*":
        return Response(b"", 304, headers)
    return Response(body, 200, headers)
