"""Build the Quart app for a config: every long-lived object is made here and passed down.

`create_app` reads top to bottom: `Services`, the one holder of the app's long-lived objects
(what exists before serving: the database, the live-state stores, the people who sign in, the
OAuth server, per-user connections), the routes, the ASGI stack in front of Quart (one visible
list), and the lifespan, which opens `proxy.runtime.serving.Serving` (what exists while the app
serves) on one exit stack and closes it in the reverse order. A route module's collaborators
are bound to its handlers when it registers them; a request that needs the serving objects
reaches them through `proxy.held.held()`, the one accessor.
"""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
from quart import Quart

from proxy import cards, console, metadata
from proxy import web as edge
from proxy.api import routes as api_routes
from proxy.api.context import Api
from proxy.audit import AuditSink
from proxy.audit.outbox import OutboxWorker
from proxy.bodycap import BodyCap
from proxy.config import Config, parse_networks
from proxy.connect import routes as connect_routes
from proxy.connect.guarded import GuardedClient
from proxy.connect.links import ConnectLinks
from proxy.connect.manager import Connections
from proxy.connect.vault import Vault, keys_from_env
from proxy.destinations import IPNetwork, Resolver
from proxy.held import EXTENSION
from proxy.mcp.asgi import McpEdge
from proxy.mcp.gateway import Gateway
from proxy.mirror import POLL_S as REGISTRY_POLL_S
from proxy.oauth import keys as oauth_keys
from proxy.oauth import routes as oauth_routes
from proxy.oauth.cap import OAuthBodyCap
from proxy.oauth.server import AuthorizationServer
from proxy.observability import routes as observability_routes
from proxy.observability.health import Health
from proxy.observability.logs import RequestLog
from proxy.observability.metrics import Metrics, multiprocess_dir
from proxy.people import signin
from proxy.people.accounts import Accounts
from proxy.people.directory import Directory
from proxy.people.signin import Web
from proxy.runtime.serving import Serving
from proxy.scim import edge as scim_edge
from proxy.scim.edge import ScimApp, ScimEdge
from proxy.scim.storage import ScimStore
from proxy.state import Stores, open_stores
from proxy.state.inflight import Later
from proxy.storage.db import Database
from proxy.upstream import UpstreamRoute
from proxy.upstream.identity import IdentityForwarder
from proxy.upstream.stdio import LocalUpstreams
from proxy.upstream.tenants import PeopleAttributes
from proxy.web.paths import Tollhouse

BODY_TIMEOUT_S = 60.0
ASGIApp = Any  # an ASGI callable: Quart's, or a layer of the stack in front of it


@dataclass(frozen=True)
class Overrides:
    """What a test (or the CLI) puts in place of the defaults: `create_app`'s keywords."""

    upstream_transport: httpx.AsyncBaseTransport | None = None
    audit_sink: AuditSink | None = None  # in place of the database's (and its usage outbox)
    base_dir: Path | None = None
    clock: Callable[[], float] = time.monotonic  # the live-state stores' clock
    wall_clock: Callable[[], float] = time.time  # when a connect link expires (every replica's)
    # and the memory approvals' (an approval's expiry, `expires_s`)
    resolver: Resolver | None = None
    secret_key: str | None = None  # TOLLHOUSE_SECRET_KEY's value (read from os.environ if None)
    vault_keys: dict[str, bytes] | None = None
    later: Later | None = None  # the call deadlines' clock (the running loop's unless given)
    registry_poll_s: float = REGISTRY_POLL_S  # how often the registry reads others' changes
    span_exporter: Any = None  # with tracing on: where spans go instead of OTLP/HTTP


def create_app(cfg: Config, **overrides: Any) -> Quart:
    """The app for `cfg`; `overrides` are `Overrides`' fields (tests move the clocks)."""
    services = Services(cfg, Overrides(**overrides))
    app = Tollhouse("tollhouse")  # routes match the path as sent (proxy.web.paths)
    app.config.update(MAX_CONTENT_LENGTH=cfg.server.max_request_bytes,
                      BODY_TIMEOUT=BODY_TIMEOUT_S, RESPONSE_TIMEOUT=None,
                      PROVIDE_AUTOMATIC_OPTIONS=False)
    app.extensions[EXTENSION] = services

    @app.while_serving  # type: ignore[type-var]
    async def lifespan() -> AsyncIterator[None]:
        async with services.serve():
            yield

    _routes(app, services)
    # the ASGI stack, outermost first: each layer answers what it owns and hands the rest on
    layers: list[Callable[[ASGIApp], ASGIApp]] = [
        lambda inner: BodyCap(inner, "/api/v1/", cfg.server.max_request_bytes, "api"),
        lambda inner: McpEdge(inner, services.edge_gateway,
                              max_body=cfg.server.max_request_bytes,
                              body_timeout_s=BODY_TIMEOUT_S,
                              heartbeat_s=cfg.server.sse_heartbeat_s,
                              refused=services.request_log.refused,
                              passed_on=(cards.SUFFIX,)),  # server cards: Quart's
    ]
    if services.scim is not None:
        scim = services.scim
        layers.insert(0, lambda inner: ScimEdge(inner, scim))  # /scim/v2: SCIM's own shapes
    if services.oauth is not None and services.web is not None:
        layers.append(OAuthBodyCap)  # /oauth/: 64 KiB whatever max_request_bytes says
    stack: ASGIApp = app.asgi_app
    for layer in reversed(layers):
        stack = layer(stack)
    app.asgi_app = stack  # type: ignore[method-assign]
    return app


class Services:
    """The app's long-lived objects, in one holder (`app.extensions["tollhouse"]`): what
    exists before serving, built here, and `serving`, what exists while the app serves (None
    otherwise). The serving objects of the last start stay readable after it closed
    (`gateway`, `api`...: what they recorded)."""

    def __init__(self, cfg: Config, given: Overrides) -> None:
        self.cfg, self.given = cfg, given
        self.base_dir = given.base_dir or Path.cwd()
        # the deployment's secret, read once: it seals the OAuth keys, the vault (without
        # TOLLHOUSE_VAULT_KEYS) and a virtual endpoint's list cursors
        self.secret_key = os.environ.get("TOLLHOUSE_SECRET_KEY", "") \
            if given.secret_key is None else given.secret_key
        self.local = LocalUpstreams()  # the stdio upstreams' processes
        # the serving table: the config's upstreams (proxy.compiled) and the API's (registry)
        self.routes: dict[str, UpstreamRoute] = {}
        self.origins = _origins(cfg)
        self.trusted: tuple[IPNetwork, ...] = tuple(
            parse_networks(cfg.server.trusted_proxies, "server.trusted_proxies"))
        self.identity = IdentityForwarder(cfg, self.base_dir)
        self.request_log = RequestLog(cfg.observability.log_format)
        # every piece of shared live state
        self.stores: Stores = open_stores(cfg, given.clock, given.wall_clock)
        self.database = Database(cfg.database.url, busy_timeout_s=cfg.database.busy_timeout_s)
        self.database.ensure_schema()  # start-up migrations (proxy.storage.migrations): idempotent
        self.metrics = Metrics(multiproc_dir=multiprocess_dir()) \
            if cfg.observability.metrics else None
        self.web = self._web()
        self.accounts = self.web.accounts if self.web is not None else Accounts(self.database)
        # [[auth.group_roles]]: what a person's groups give them wherever they are read
        self.accounts.configured_group_roles = tuple((m.group, m.role)
                                                     for m in cfg.auth.group_roles)
        # what fills a per-caller upstream's placeholder no claim does: the person's
        # attributes, through the API's own Accounts (a change there applies to the next call)
        self.people = PeopleAttributes(self.accounts) \
            if any(u.templated for u in cfg.upstreams) or cfg.policy.files else None
        self.oauth = self._oauth()
        self.connections = self._connections()
        self.scim = self._scim()
        self._serving: Serving | None = None
        self._last: Serving | None = None

    def _web(self) -> Web | None:
        """Browser sign-in, wherever a person signs in here."""
        cfg, stores = self.cfg, self.stores
        per_user = any(u.auth == "per_user" for u in cfg.upstreams)
        if not (cfg.oauth_server.enabled or cfg.auth.oidc.enabled or per_user
                or cfg.console.enabled):
            return None
        return Web(Accounts(self.database), stores.browser_sessions, stores.lockouts,
                   cfg.server.public_url.rstrip("/"), self.given.clock,
                   oidc_enabled=cfg.auth.oidc.enabled, trusted_proxies=self.trusted,
                   signin_flows=stores.signin_flows)

    def _oauth(self) -> AuthorizationServer | None:
        cfg, stores = self.cfg, self.stores
        if not cfg.oauth_server.enabled:
            return None
        ring = oauth_keys.KeyRing(self.database, self.secret_key,
                                  cfg.oauth_server.key_rotation_s,
                                  cfg.oauth_server.access_token_ttl_s)
        return AuthorizationServer(cfg, self.database, ring, endpoints=self.routes,
                                   codes=stores.codes, revocations=stores.revocations,
                                   consents=stores.consent_flows, rotations=stores.rotations,
                                   http=lambda: self.edge_gateway().upstream.http)

    def _connections(self) -> Connections | None:
        """Per-user upstream connections, where an upstream has `auth = "per_user"`."""
        if not any(u.auth == "per_user" for u in self.cfg.upstreams):
            return None
        given = self.given
        keys = given.vault_keys or keys_from_env({
            "TOLLHOUSE_VAULT_KEYS": os.environ.get("TOLLHOUSE_VAULT_KEYS", "")
            if given.secret_key is None else "",
            "TOLLHOUSE_SECRET_KEY": self.secret_key})
        links = ConnectLinks(self.stores.connect_links, self.cfg.server.public_url,
                             self.cfg.server.connect_link_ttl_s, given.wall_clock)
        return Connections(self.cfg, Vault(self.database, keys), GuardedClient(given.resolver),
                           flows=self.stores.connect_flows, leases=self.stores.leases,
                           people=self.people, links=links)

    def _scim(self) -> ScimApp | None:
        """SCIM provisioning at /scim/v2, with `[scim] enabled`."""
        cfg = self.cfg
        if not cfg.scim.enabled:
            return None
        served = scim_edge.provider()
        store = ScimStore(Directory(self.database), scim_edge.models_of(served))
        return ScimApp(store, served, cfg.scim.token, cfg.server.public_url,
                       cfg.server.max_request_bytes)

    @property
    def cursor_key(self) -> bytes:
        """What seals a virtual endpoint's list cursors: the deployment's secret key, so every
        replica opens every other's cursors; without one, this process's own random key."""
        return self.secret_key.encode() if self.secret_key else os.urandom(32)

    @asynccontextmanager
    async def serve(self) -> AsyncIterator[Serving]:
        """The app's lifespan: `serving` from the moment it is open until it is closed."""
        try:
            async with Serving.opened(self) as serving:
                self._serving = self._last = serving
                yield serving
        finally:
            self._serving = None

    @property
    def serving(self) -> Serving | None:
        """While serving: drain (SIGTERM) and reload (SIGHUP) here; None otherwise."""
        return self._serving

    def edge_gateway(self) -> Gateway:
        """The MCP edge's gateway, on each request."""
        last = self._last
        assert last is not None, "the gateway is built when the app starts serving"
        return last.gateway

    # what the last start built, readable after it closed (tests read what it recorded)
    @property
    def gateway(self) -> Gateway | None:
        return None if self._last is None else self._last.gateway

    @property
    def api(self) -> Api | None:
        return None if self._last is None else self._last.api

    @property
    def health(self) -> Health | None:
        return None if self._last is None else self._last.health

    @property
    def outbox(self) -> OutboxWorker | None:
        last = self._last
        return None if last is None or last.outbox is None else last.outbox.worker

    @property
    def tracing(self) -> Any:
        serving = self._serving  # the tracer is shut down with the rest: None once closed
        return None if serving is None else serving.tracing


def _origins(cfg: Config) -> frozenset[str]:
    """The browser Origins a request may come from: the configured ones and the gateway's."""
    origins = {o.rstrip("/").lower() for o in cfg.server.allowed_origins}
    public = urlsplit(cfg.server.public_url)
    origins.add(f"{public.scheme}://{public.netloc}".lower())
    return frozenset(origins)


def _routes(app: Quart, services: Services) -> None:
    """Every Quart route; /mcp/<endpoint> is the ASGI edge in front of them."""
    cfg, web = services.cfg, services.web
    edge.register(app)
    if web is not None:
        signin.register(app, web)
        if services.oauth is not None:
            oauth_routes.register(app, services.oauth, web)
        if services.connections is not None:
            connect_routes.register(app, services.connections, web)
        if cfg.console.enabled:
            console.register(app, web)
        if cfg.auth.oidc.enabled:
            from proxy.people import oidc

            oidc.register(app, lambda: web, cfg.auth.oidc,
                          lambda: services.edge_gateway().upstream.http,
                          cfg.server.public_url.rstrip("/"))

    def api_scopes(name: str) -> list[str] | None:
        api = services.api
        if api is None:
            return None
        scopes = api.registry.scopes_of(name)
        if scopes is None and api.endpoints is not None:  # a virtual endpoint's
            scopes = api.endpoints.scopes_of(name)
        return scopes

    metadata.register(app, cfg, services.identity, own_server=services.oauth is not None,
                      api_scopes=api_scopes)
    cards.register(app, cfg.server.public_url, cfg.auth.mode != "none")
    api_routes.register(app)
    observability_routes.register(app, cfg.observability, services.metrics,
                                  lambda: services.serving)
