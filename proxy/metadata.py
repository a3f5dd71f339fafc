"""Discovery documents: OAuth protected-resource metadata (RFC 9728) for each endpoint, and
the gateway's own signing keys for upstreams that receive identity tokens."""

from __future__ import annotations

import orjson
from quart import Quart, Response

from proxy.config import Config
from proxy.upstream.identity import IdentityForwarder

JSON = {"Content-Type": "application/json", "Cache-Control": "public, max-age=300"}


def register(app: Quart, cfg: Config, identity: IdentityForwarder, *,
             own_server: bool = False) -> None:
    public_url = cfg.server.public_url.rstrip("/")
    servers = ([public_url] if own_server else []) + [
        s for s in cfg.auth.authorization_servers if s.rstrip("/") != public_url]
    documents = {
        u.name: orjson.dumps({
            "resource": f"{public_url}/mcp/{u.name}",
            "resource_name": u.name,
            "authorization_servers": servers,
            "scopes_supported": sorted(set(cfg.auth.scopes_supported)
                                       | set(u.access.allow_scopes)),
            "bearer_methods_supported": ["header"],
        })
        for u in cfg.upstreams
    }
    jwks = orjson.dumps(identity.jwks())

    @app.route("/.well-known/oauth-protected-resource/mcp/<endpoint>")
    async def protected_resource(endpoint: str) -> Response:
        document = documents.get(endpoint)
        if document is None:
            return Response(b'{"error":"not found"}', 404, {"Content-Type": "application/json"})
        return Response(document, 200, JSON)

    @app.route("/.well-known/jwks.json")
    async def gateway_jwks() -> Response:
        return Response(jwks, 200, JSON)
