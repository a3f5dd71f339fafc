"""Build the Quart app for a config: every long-lived object is made here and passed down."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from urllib.parse import urlsplit

import httpx
from quart import Quart

from policies import build_egress, default_policies
from policies.access import Access
from proxy import edge, metadata, signin
from proxy.accounts import Accounts
from proxy.api import routes as api_routes
from proxy.api.context import Api, provide
from proxy.audit import AuditSink, SqliteAuditSink
from proxy.auth.authenticator import Authenticator, BearerAuth, NoAuth
from proxy.auth.keys import KeyIndex
from proxy.auth.people import LiveUsers
from proxy.bodycap import BodyCap
from proxy.chain import Chain
from proxy.config import Config, parse_networks
from proxy.connect import routes as connect_routes
from proxy.connect.guarded import GuardedClient
from proxy.connect.manager import Connections
from proxy.connect.vault import Vault, keys_from_env
from proxy.db import Database
from proxy.egress import Destinations, Resolver, SystemResolver, parse_addresses
from proxy.mcp.asgi import McpEdge
from proxy.mcp.gateway import Gateway
from proxy.metering import OutboxWorker, build_backend
from proxy.oauth import keys as oauth_keys
from proxy.oauth import routes as oauth_routes
from proxy.oauth.cap import OAuthBodyCap
from proxy.oauth.server import AuthorizationServer
from proxy.registry import POLL_S as REGISTRY_POLL_S
from proxy.registry import Registry
from proxy.signin import Web
from proxy.state import Stores, open_stores
from proxy.state.inflight import Later
from proxy.upstream import UpstreamClient, UpstreamRoute
from proxy.upstream.identity import IdentityForwarder

log = logging.getLogger("tollhouse")

BODY_TIMEOUT_S = 60.0


class State:
    """What the app holds while serving; tests reach sessions and in-flight calls here."""

    gateway: Gateway | None = None
    outbox: OutboxWorker | None = None
    web: Web | None = None
    oauth: AuthorizationServer | None = None
    connections: Connections | None = None
    api: Api | None = None
    stores: Stores | None = None


def create_app(cfg: Config, *, upstream_transport: httpx.AsyncBaseTransport | None = None,
               audit_sink: AuditSink | None = None, base_dir: Path | None = None,
               clock: Callable[[], float] = time.monotonic,
               resolver: Resolver | None = None, secret_key: str | None = None,
               vault_keys: dict[str, bytes] | None = None, later: Later | None = None,
               registry_poll_s: float = REGISTRY_POLL_S) -> Quart:
    """`clock` is the live-state stores' clock and `later` the call deadlines' (the running
    loop's unless given): tests move both by hand. `registry_poll_s`: how often the server
    registry looks for changes other gateways made."""
    app = Quart("tollhouse")
    app.config.update(
        MAX_CONTENT_LENGTH=cfg.server.max_request_bytes,
        BODY_TIMEOUT=BODY_TIMEOUT_S,
        RESPONSE_TIMEOUT=None,
        PROVIDE_AUTOMATIC_OPTIONS=False,
    )
    routes = {u.name: UpstreamRoute.from_config(u) for u in cfg.upstreams}
    trusted = parse_networks(cfg.server.trusted_proxies, "server.trusted_proxies")
    base_dir = base_dir or Path.cwd()
    identity = IdentityForwarder(cfg, base_dir)
    stores = open_stores(cfg, clock)  # every piece of shared live state ([state] url)
    lockouts = stores.lockouts
    origins = {o.rstrip("/").lower() for o in cfg.server.allowed_origins}
    public = urlsplit(cfg.server.public_url)
    origins.add(f"{public.scheme}://{public.netloc}".lower())
    state = State()
    state.stores = stores
    app.extensions["tollhouse"] = state
    database = Database(cfg.database.url, busy_timeout_s=cfg.database.busy_timeout_s)
    database.ensure_schema()  # start-up migrations (proxy.migrations): versioned, idempotent
    per_user = any(u.auth == "per_user" for u in cfg.upstreams)
    people = cfg.oauth_server.enabled or cfg.auth.oidc.enabled or per_user
    web: Web | None = None
    oauth_server: AuthorizationServer | None = None
    if people:
        web = Web(Accounts(database), stores.browser_sessions,
                  lockouts, cfg.server.public_url.rstrip("/"), clock,
                  oidc_enabled=cfg.auth.oidc.enabled,
                  trusted_proxies=trusted, signin_flows=stores.signin_flows)
        state.web = web
    if cfg.oauth_server.enabled:
        ring = oauth_keys.KeyRing(database, os.environ.get("TOLLHOUSE_SECRET_KEY", "")
                                  if secret_key is None else secret_key,
                                  cfg.oauth_server.key_rotation_s,
                                  cfg.oauth_server.access_token_ttl_s)
        oauth_server = AuthorizationServer(cfg, database, ring, endpoints=routes,
                                           codes=stores.codes, revocations=stores.revocations,
                                           consents=stores.consent_flows)
        state.oauth = oauth_server
    connections: Connections | None = None
    if per_user:
        keys = vault_keys or keys_from_env(
            None if secret_key is None else {"TOLLHOUSE_SECRET_KEY": secret_key})
        connections = Connections(cfg, Vault(database, keys),
                                  GuardedClient(resolver), flows=stores.connect_flows)
        state.connections = connections

    @app.while_serving  # type: ignore[type-var]
    async def lifespan() -> AsyncIterator[None]:
        destinations = Destinations((), resolver or SystemResolver(),
                                    parse_addresses(cfg.egress.metadata_addresses))
        egress = build_egress(cfg, destinations, trusted)
        upstream = UpstreamClient(upstream_transport, destinations=destinations)
        audit = audit_sink or SqliteAuditSink(database)
        backend = worker = worker_task = None
        if cfg.metering.enabled:
            backend = build_backend(cfg.metering, upstream.http)
            if isinstance(audit, SqliteAuditSink):
                worker = OutboxWorker(database, backend,
                                      cfg.metering.retry_max_s)
                audit.on_outbox = worker.wake_threadsafe
                worker_task = asyncio.get_running_loop().create_task(worker.run())
        chain = Chain(default_policies(cfg, metering=backend, egress=egress,
                                       rate_limits=stores.rate_limits))
        state.outbox = worker
        keys = None
        authenticator: Authenticator = NoAuth()
        if cfg.auth.mode == "jwt":
            keys = KeyIndex(database)
            authenticator = BearerAuth(
                cfg, base_dir, upstream.http, keys, lockouts, clock, tollhouse=oauth_server,
                people=LiveUsers(web.accounts) if oauth_server is not None and web is not None
                else None)
        access = next((p for p in chain.policies if isinstance(p, Access)), None)
        registry = Registry(cfg, routes, egress, access, database, poll_s=registry_poll_s)
        registry_watch = asyncio.get_running_loop().create_task(registry.watch())
        state.api = Api(registry, keys, database, web, lockouts,
                        cfg.server.max_request_bytes, clock,
                        web.accounts if web is not None else Accounts(database),
                        forget_person=getattr(connections, "forget", None),
                        trusted_proxies=trusted)
        provide(app, state.api)
        state.gateway = Gateway(
            routes=routes, authenticator=authenticator, chain=chain, sessions=stores.sessions,
            inflight=stores.inflight, upstream=upstream, audit=audit,
            allowed_origins=frozenset(origins), identity=identity, connections=connections,
            trusted_proxies=trusted, bridged=stores.bridge, later=later)
        try:
            yield
        finally:
            await state.gateway.drain(cfg.server.shutdown_grace_s)
            await audit.close()  # every accepted record and usage event is on disk now
            if worker_task is not None:
                worker_task.cancel()  # undelivered events wait in the outbox for the next start
                await asyncio.wait({worker_task}, timeout=5)
            await upstream.aclose()
            if connections is not None:
                await connections.aclose()
            if keys is not None:
                keys.close()
            registry_watch.cancel()
            await asyncio.wait({registry_watch}, timeout=5)
            registry.close()
            database.close()

    def gateway() -> Gateway:
        assert state.gateway is not None, "the gateway is built when the app starts serving"
        return state.gateway

    edge.register(app)
    if web is not None:
        people_web: Web = web
        signin.register(app, people_web)
    if oauth_server is not None and web is not None:
        oauth_routes.register(app, oauth_server, people_web)
        app.asgi_app = OAuthBodyCap(app.asgi_app)  # type: ignore[method-assign,assignment]
    if connections is not None and web is not None:
        connect_routes.register(app, connections, people_web)
    if cfg.auth.oidc.enabled and web is not None:
        from proxy import oidc  # type: ignore[attr-defined,unused-ignore]

        oidc.register(app, lambda: people_web, cfg.auth.oidc,
                      lambda: gateway().upstream.http, cfg.server.public_url.rstrip("/"))
    app.asgi_app = McpEdge(app.asgi_app, gateway,  # type: ignore[method-assign,assignment,arg-type]
                                max_body=cfg.server.max_request_bytes,
                                body_timeout_s=BODY_TIMEOUT_S)
    def api_scopes(name: str) -> list[str] | None:
        return state.api.registry.scopes_of(name) if state.api is not None else None

    metadata.register(app, cfg, identity, own_server=oauth_server is not None,
                      api_scopes=api_scopes)

    api_routes.register(app)
    app.asgi_app = BodyCap(app.asgi_app, "/api/v1/",  # type: ignore[method-assign,assignment,arg-type]
                           cfg.server.max_request_bytes, "api")
    return app
