"""Discovery documents: OAuth protected-resource metadata (RFC 9728) for each endpoint, and
the gateway's own signing keys for upstreams that receive identity tokens."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import orjson
from quart import Quart, Response

from proxy.config import Config
from proxy.errors import EndpointNotFound
from proxy.upstream.identity import IdentityForwarder

JSON = {"Content-Type": "application/json", "Cache-Control": "public, max-age=300"}


def register(app: Quart, cfg: Config, identity: IdentityForwarder, *,
             own_server: bool = False,
             api_scopes: Callable[[str], Iterable[str] | None] = lambda name: None) -> None:
    """`api_scopes(name)`: the `allow_scopes` of a server the management API registered, or
    None when there is no such server (now)."""
    public_url = cfg.server.public_url.rstrip("/")
    servers = ([public_url] if own_server else []) + [
        s for s in cfg.auth.authorization_servers if s.rstrip("/") != public_url]

    def document(name: str, scopes: Iterable[str]) -> bytes:
        return orjson.dumps({
            "resource": f"{public_url}/mcp/{name}",
            "resource_name": name,
            "authorization_servers": servers,
            "scopes_supported": sorted(set(cfg.auth.scopes_supported) | set(scopes)),
            "bearer_methods_supported": ["header"],
        })

    documents = {u.name: document(u.name, u.access.allow_scopes) for u in cfg.upstreams}
    documents.update({e.name: document(e.name, e.access.allow_scopes)  # virtual endpoints
                      for e in cfg.endpoints})
    jwks = orjson.dumps(identity.jwks())

    @app.route("/.well-known/oauth-protected-resource/mcp/<endpoint>")
    async def protected_resource(endpoint: str) -> Response:
        found = documents.get(endpoint)
        if found is None:  # a server registered through /api/v1, as it is now
            scopes = api_scopes(endpoint)
            if scopes is not None:
                found = document(endpoint, scopes)
        if found is None:
            raise EndpointNotFound()
        return Response(found, 200, JSON)

    @app.route("/.well-known/jwks.json")
    async def gateway_jwks() -> Response:
        return Response(jwks, 200, JSON)
