"""Build the Quart app for a config: every long-lived object is made here and passed down.

`create_app` reads top to bottom: the parts that exist before serving (database, live-state
stores, the people who sign in, the OAuth server, per-user connections), the routes, the ASGI
stack in front of Quart (one visible list), and `Serving`, what exists while the app serves
(the upstream client, the policy chain, the caller's identity, the registry, the management
API and the MCP gateway), opened and closed by the Quart lifespan.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
from quart import Quart

from policies import build_egress, default_policies
from policies.access import Access
from policies.guardrails import Hidden
from policies.guardrails.pinning import Pins
from policies.metering import MeteringBackend
from proxy import console, edge, metadata, reload
from proxy.api import routes as api_routes
from proxy.api.context import Api, provide
from proxy.audit import AuditSink, DatabaseAuditSink
from proxy.auth.authenticator import Authenticator, BearerAuth, NoAuth
from proxy.auth.keys import KeyIndex
from proxy.bodycap import BodyCap
from proxy.chain import Chain
from proxy.config import Config, parse_networks
from proxy.confine import Environment
from proxy.connect import routes as connect_routes
from proxy.connect.guarded import GuardedClient
from proxy.connect.manager import Connections
from proxy.connect.vault import Vault, keys_from_env
from proxy.db import Database
from proxy.edge.paths import Tollhouse
from proxy.egress import Destinations, IPNetwork, Resolver, SystemResolver, parse_addresses
from proxy.live import Live
from proxy.mcp.asgi import McpEdge
from proxy.mcp.gateway import Gateway
from proxy.metering import OutboxWorker, build_backend
from proxy.mirror import POLL_S as REGISTRY_POLL_S
from proxy.mirror import Mirrors
from proxy.oauth import keys as oauth_keys
from proxy.oauth import routes as oauth_routes
from proxy.oauth.cap import OAuthBodyCap
from proxy.oauth.server import AuthorizationServer
from proxy.observability import Observer, Observers
from proxy.observability import routes as observability_routes
from proxy.observability.health import Health
from proxy.observability.logs import RequestLog
from proxy.observability.metrics import Metrics, multiprocess_dir, timed
from proxy.people import signin
from proxy.people.accounts import Accounts
from proxy.people.live import LiveUsers
from proxy.people.signin import Web
from proxy.pins import DatabasePins
from proxy.published import Published
from proxy.registry import Registry
from proxy.seen import LastSeen
from proxy.state import Stores, open_stores
from proxy.state.inflight import Later
from proxy.state.sessions import RedisSessionStore
from proxy.upstream import UpstreamClient, UpstreamRoute
from proxy.upstream.identity import IdentityForwarder
from proxy.upstream.stdio import LocalUpstreams
from proxy.upstream.tenants import PeopleAttributes, Tenants
from proxy.virtual import VirtualRoute
from proxy.virtual.registry import Endpoints

log = logging.getLogger("tollhouse")

BODY_TIMEOUT_S = 60.0
DRAIN_POLL_S = 0.05  # how often a drain looks whether the calls in flight are done
ASGIApp = Any  # an ASGI callable: Quart's, or a layer of the stack in front of it


class State:
    """What the app holds while serving; tests reach sessions and in-flight calls here."""

    gateway: Gateway | None = None
    outbox: OutboxWorker | None = None
    web: Web | None = None
    oauth: AuthorizationServer | None = None
    connections: Connections | None = None
    api: Api | None = None
    stores: Stores | None = None
    metrics: Metrics | None = None
    health: Health | None = None
    tracing: Any = None  # proxy.observability.tracing.Tracing while serving with tracing on
    serving: Serving | None = None  # while serving: drain (SIGTERM) and reload (SIGHUP) here


@dataclass(frozen=True)
class Overrides:
    """What a test (or the CLI) puts in place of the defaults."""

    upstream_transport: httpx.AsyncBaseTransport | None = None
    audit_sink: AuditSink | None = None
    base_dir: Path | None = None
    clock: Callable[[], float] = time.monotonic  # the live-state stores' clock
    resolver: Resolver | None = None
    secret_key: str | None = None
    vault_keys: dict[str, bytes] | None = None
    later: Later | None = None  # the call deadlines' clock (the running loop's unless given)
    registry_poll_s: float = REGISTRY_POLL_S  # how often the registry reads others' changes
    span_exporter: Any = None  # with tracing on: where spans go instead of OTLP/HTTP


@dataclass
class Parts:
    """What exists before the app serves."""

    cfg: Config
    given: Overrides
    routes: dict[str, UpstreamRoute]
    trusted: tuple[IPNetwork, ...]
    identity: IdentityForwarder
    stores: Stores
    database: Database
    state: State
    origins: frozenset[str]
    health: Health
    request_log: RequestLog
    metrics: Metrics | None = None
    web: Web | None = None
    oauth: AuthorizationServer | None = None
    connections: Connections | None = None
    local: LocalUpstreams = field(default_factory=LocalUpstreams)  # stdio upstreams' processes


def create_app(cfg: Config, *, upstream_transport: httpx.AsyncBaseTransport | None = None,
               audit_sink: AuditSink | None = None, base_dir: Path | None = None,
               clock: Callable[[], float] = time.monotonic, resolver: Resolver | None = None,
               secret_key: str | None = None, vault_keys: dict[str, bytes] | None = None,
               later: Later | None = None, registry_poll_s: float = REGISTRY_POLL_S,
               span_exporter: Any = None) -> Quart:
    """The app for `cfg`; the keywords are `Overrides` (tests move the clocks)."""
    given = Overrides(upstream_transport, audit_sink, base_dir, clock, resolver, secret_key,
                      vault_keys, later, registry_poll_s, span_exporter)
    app = Tollhouse("tollhouse")  # routes match the path as sent (proxy.edge.paths)
    app.config.update(MAX_CONTENT_LENGTH=cfg.server.max_request_bytes,
                      BODY_TIMEOUT=BODY_TIMEOUT_S, RESPONSE_TIMEOUT=None,
                      PROVIDE_AUTOMATIC_OPTIONS=False)
    parts = _parts(cfg, given)
    app.extensions["tollhouse"] = parts.state

    @app.while_serving  # type: ignore[type-var]
    async def lifespan() -> AsyncIterator[None]:
        serving = parts.state.serving = await Serving.open(parts, app)
        try:
            yield
        finally:
            await serving.close()
            parts.state.serving = None

    _routes(app, parts)
    # the ASGI stack, outermost first: each layer answers what it owns and hands the rest on
    layers: list[Callable[[ASGIApp], ASGIApp]] = [
        lambda inner: BodyCap(inner, "/api/v1/", cfg.server.max_request_bytes, "api"),
        lambda inner: McpEdge(inner, lambda: _gateway(parts.state),
                              max_body=cfg.server.max_request_bytes,
                              body_timeout_s=BODY_TIMEOUT_S,
                              heartbeat_s=cfg.server.sse_heartbeat_s,
                              refused=parts.request_log.refused),
    ]
    if parts.oauth is not None and parts.web is not None:
        layers.append(OAuthBodyCap)  # /oauth/: 64 KiB whatever max_request_bytes says
    stack: ASGIApp = app.asgi_app
    for layer in reversed(layers):
        stack = layer(stack)
    app.asgi_app = stack  # type: ignore[method-assign]
    return app


def _parts(cfg: Config, given: Overrides) -> Parts:
    local = LocalUpstreams()
    routes = {u.name: UpstreamRoute.from_config(u, local.transport(u)) for u in cfg.upstreams}
    origins = {o.rstrip("/").lower() for o in cfg.server.allowed_origins}
    public = urlsplit(cfg.server.public_url)
    origins.add(f"{public.scheme}://{public.netloc}".lower())
    stores = open_stores(cfg, given.clock)  # every piece of shared live state ([state] url)
    state = State()
    state.stores = stores
    database = Database(cfg.database.url, busy_timeout_s=cfg.database.busy_timeout_s)
    database.ensure_schema()  # start-up migrations (proxy.migrations): versioned, idempotent
    metrics = state.metrics = Metrics(multiproc_dir=multiprocess_dir()) \
        if cfg.observability.metrics else None
    health = state.health = Health(database, stores, metrics)
    parts = Parts(cfg, given, routes,
                  tuple(parse_networks(cfg.server.trusted_proxies, "server.trusted_proxies")),
                  IdentityForwarder(cfg, given.base_dir or Path.cwd()), stores, database, state,
                  frozenset(origins), health, RequestLog(cfg.observability.log_format), metrics,
                  local=local)
    _people(parts)
    return parts


def _cursor_key(given: Overrides) -> bytes:
    """What seals a virtual endpoint's list cursors: the deployment's secret key, so every
    replica opens every other's cursors; without one, this process's own random key."""
    secret = os.environ.get("TOLLHOUSE_SECRET_KEY", "") if given.secret_key is None \
        else given.secret_key
    return secret.encode() if secret else os.urandom(32)


def _people(parts: Parts) -> None:
    """Sign-in, the OAuth server and per-user upstream connections, each when configured."""
    cfg, given, stores = parts.cfg, parts.given, parts.stores
    per_user = any(u.auth == "per_user" for u in cfg.upstreams)
    if cfg.oauth_server.enabled or cfg.auth.oidc.enabled or per_user or cfg.console.enabled:
        parts.web = parts.state.web = Web(
            Accounts(parts.database), stores.browser_sessions, stores.lockouts,
            cfg.server.public_url.rstrip("/"), given.clock, oidc_enabled=cfg.auth.oidc.enabled,
            trusted_proxies=parts.trusted, signin_flows=stores.signin_flows)
    secret = os.environ.get("TOLLHOUSE_SECRET_KEY", "") if given.secret_key is None \
        else given.secret_key
    if cfg.oauth_server.enabled:
        ring = oauth_keys.KeyRing(parts.database, secret, cfg.oauth_server.key_rotation_s,
                                  cfg.oauth_server.access_token_ttl_s)
        parts.oauth = parts.state.oauth = AuthorizationServer(
            cfg, parts.database, ring, endpoints=parts.routes, codes=stores.codes,
            revocations=stores.revocations, consents=stores.consent_flows,
            rotations=stores.rotations)
    if per_user:
        keys = given.vault_keys or keys_from_env(
            None if given.secret_key is None else {"TOLLHOUSE_SECRET_KEY": given.secret_key})
        parts.connections = parts.state.connections = Connections(
            cfg, Vault(parts.database, keys), GuardedClient(given.resolver),
            flows=stores.connect_flows, leases=stores.leases)


def _routes(app: Quart, parts: Parts) -> None:
    """Every Quart route; /mcp/<endpoint> is the ASGI edge in front of them."""
    cfg, web = parts.cfg, parts.web
    edge.register(app)
    if web is not None:
        signin.register(app, web)
        if parts.oauth is not None:
            oauth_routes.register(app, parts.oauth, web)
        if parts.connections is not None:
            connect_routes.register(app, parts.connections, web)
        if cfg.console.enabled:
            console.register(app, web)
        if cfg.auth.oidc.enabled:
            from proxy.people import oidc

            oidc.register(app, lambda: web, cfg.auth.oidc,
                          lambda: _gateway(parts.state).upstream.http,
                          cfg.server.public_url.rstrip("/"))
    state = parts.state

    def api_scopes(name: str) -> list[str] | None:
        if state.api is None:
            return None
        scopes = state.api.registry.scopes_of(name)
        if scopes is None and state.api.endpoints is not None:  # a virtual endpoint's
            scopes = state.api.endpoints.scopes_of(name)
        return scopes

    metadata.register(app, cfg, parts.identity, own_server=parts.oauth is not None,
                      api_scopes=api_scopes)
    api_routes.register(app)
    observability_routes.register(app, cfg.observability, parts.metrics, parts.health,
                                  lambda: state.serving)


def _gateway(state: State) -> Gateway:
    assert state.gateway is not None, "the gateway is built when the app starts serving"
    return state.gateway


@dataclass
class Serving:
    """What exists while the app serves, and the order it is closed in. `draining` (true from
    the moment `drain` begins, on SIGTERM) is what /readyz and the MCP edge's refusals read:
    one flag, the gateway's."""

    parts: Parts
    upstream: UpstreamClient
    audit: AuditSink
    registry: Registry
    mirrors: Mirrors  # the registry's, the virtual endpoints', the pins' and the keys'
    keys: KeyIndex | None
    worker_task: asyncio.Task[None] | None
    destinations: Destinations
    backend: MeteringBackend | None
    drain_deadline: float | None = None  # the loop's time the drain's grace ends at
    sampler: asyncio.Task[None] | None = None
    # the guardrails' pinned definitions and what the last lists hid: kept across reloads
    pin_store: DatabasePins | None = None
    pins: Pins | None = None
    hidden: Hidden | None = None
    added_access: Published[Any] | None = None  # the API's rules, which its registries publish

    @classmethod
    async def open(cls, parts: Parts, app: Quart) -> Serving:
        cfg, given, state = parts.cfg, parts.given, parts.state
        mirrors = Mirrors(given.registry_poll_s)
        added_access, added_destinations = Access.published(), Destinations.published()
        destinations = Destinations((), given.resolver or SystemResolver(),
                                    parse_addresses(cfg.egress.metadata_addresses),
                                    added=added_destinations)
        egress = build_egress(cfg, destinations, parts.trusted)
        upstream = UpstreamClient(given.upstream_transport, destinations=destinations)
        database = parts.database
        sqlite_file = (database.path if database.dialect == "sqlite" and not database.memory
                       else None)
        audit = given.audit_sink or DatabaseAuditSink(
            database, journal=cfg.database.journal(sqlite_file),
            commit_window_s=cfg.database.audit_commit_window_ms / 1000)
        metrics = parts.metrics
        parts.health.audit = audit
        if metrics is not None and isinstance(audit, DatabaseAuditSink):
            audit.on_fallback = metrics.audit_fallback.inc
        backend = timed(build_backend(cfg.metering, upstream.http), metrics) \
            if cfg.metering.enabled else None
        pin_store = DatabasePins(parts.database, mirrors)
        pins, hidden = pin_store.pins, Hidden()  # read at start-up, then kept in step
        chain = Chain(default_policies(cfg, metering=backend, egress=egress,
                                       rate_limits=parts.stores.rate_limits,
                                       pins=pins, hidden=hidden, added_access=added_access))
        keys = KeyIndex(parts.database, mirrors) if cfg.auth.mode == "jwt" else None
        registry = Registry(cfg, parts.routes, mirrors, added_access, added_destinations,
                            parts.database)
        virtual = {e.name: VirtualRoute.from_config(e) for e in cfg.endpoints}
        endpoints = Endpoints(cfg, virtual, registry, mirrors, added_access, parts.database)
        registry.reserved = virtual.__contains__
        state.api = Api(registry, keys, parts.database, parts.web, parts.stores.lockouts,
                        parts.web.accounts if parts.web is not None
                        else Accounts(parts.database),
                        forget_person=getattr(parts.connections, "forget", None),
                        trusted_proxies=parts.trusted, pins=pins, pin_store=pin_store,
                        audit=audit, endpoints=endpoints, seen=LastSeen(
                            parts.database, parts.routes.__contains__),
                        sessions=parts.stores.sessions, sessions_scope="cluster"
                        if isinstance(parts.stores.sessions, RedisSessionStore) else "process")
        provide(app, state.api)
        if cfg.observability.otlp_endpoint:  # the extra is there: the config check saw to it
            from proxy.observability.tracing import Tracing

            state.tracing = Tracing(cfg.observability, given.span_exporter)
        state.gateway = Gateway(
            routes=parts.routes, authenticator=_authenticator(parts, upstream, keys),
            live=Live(cfg, chain), sessions=parts.stores.sessions,
            inflight=parts.stores.inflight, upstream=upstream, audit=audit,
            allowed_origins=parts.origins, identity=parts.identity,
            connections=parts.connections, trusted_proxies=parts.trusted,
            bridged=parts.stores.bridge, later=given.later,
            observer=_observer(parts.request_log, metrics, state.tracing, state.api.seen),
            session_ended=metrics.session_ended if metrics is not None else None,
            endpoints=virtual, cursor_key=_cursor_key(given),
            max_response_bytes=cfg.server.max_response_bytes,
            resumable=parts.stores.resumable)
        endpoints.changed = registry.changed = partial(state.gateway.virtual.members_changed,
                                                       virtual)
        state.gateway.tenants = Tenants(destinations, upstream.pool, state.gateway.spawn,
                                        _people_attributes(parts, state.api.accounts))
        if parts.connections is not None:  # per_user with a per-caller URL: whose server
            parts.connections.people = state.gateway.tenants.people
        mirrors.start()  # what other processes change: servers, endpoints, pins, polled
        assert state.api.seen is not None
        await state.api.seen.start()
        await parts.stores.start()
        sampler = None
        if metrics is not None and metrics.multiproc_dir is not None:
            # one of several workers: its own gauges reach a scrape on any of them
            sampler = asyncio.get_running_loop().create_task(_sample(metrics, audit))
        serving = cls(parts, upstream, audit, registry, mirrors, keys, None, destinations,
                      backend, sampler=sampler, pin_store=pin_store, pins=pins, hidden=hidden,
                      added_access=added_access)
        serving.deliver_through(backend)
        return serving

    def deliver_through(self, backend: MeteringBackend | None) -> None:
        """The usage outbox's worker, delivering through `backend`: started with the first
        metering backend (at start-up or by a reload), pointed at each later one."""
        state = self.parts.state
        if backend is None or not isinstance(self.audit, DatabaseAuditSink):
            return
        metering = self.parts.cfg.metering
        if state.outbox is not None:
            state.outbox.backend = backend
            state.outbox.keep_delivered_s = metering.keep_delivered_h * 3600
            return
        state.outbox = OutboxWorker(self.parts.database, backend, metering.retry_max_s,
                                    keep_delivered_s=metering.keep_delivered_h * 3600)
        self.audit.on_outbox = state.outbox.wake_threadsafe
        self.audit.deliver = state.outbox.deliver_now
        self.worker_task = asyncio.get_running_loop().create_task(state.outbox.run())

    @property
    def gateway(self) -> Gateway:
        return _gateway(self.parts.state)

    @property
    def draining(self) -> bool:
        return self.gateway.draining

    @draining.setter
    def draining(self, value: bool) -> None:
        self.gateway.draining = value

    async def drain(self, grace_s: float) -> float:
        """SIGTERM: refuse what is new and end the GET streams at once, then wait up to
        `grace_s` for the calls in flight; the seconds of grace left."""
        loop = asyncio.get_running_loop()
        deadline = self.drain_deadline = loop.time() + grace_s
        self.gateway.stop_serving()
        log.info("draining: new sessions and calls are refused (503); %d call(s) in flight "
                 "get up to %g s to finish", len(self.gateway.inflight), grace_s)
        while not self.gateway.idle and loop.time() < deadline:
            await asyncio.sleep(DRAIN_POLL_S)
        left = max(0.0, deadline - loop.time())
        if not self.gateway.idle:
            log.warning("draining: %d call(s) still in flight after %g s",
                        len(self.gateway.inflight), grace_s)
        return left

    async def reload(self, path: Path, env: Environment | None = None) -> bool:
        """SIGHUP: the config file at `path` applied from the next call (proxy.reload), its
        `${VAR}`s read from `env` (os.environ without it)."""
        return await reload.reload(self, path, env)

    async def close(self) -> None:
        parts = self.parts
        if self.sampler is not None:
            self.sampler.cancel()
        grace = parts.cfg.server.shutdown_grace_s
        if self.drain_deadline is not None:  # what the drain left of it, and a moment more
            grace = max(self.drain_deadline - asyncio.get_running_loop().time(), 1.0)
        if parts.state.gateway is not None:
            await parts.state.gateway.drain(grace)
        await self.mirrors.stop()
        if self.pin_store is not None:
            await self.pin_store.aclose()
        if parts.state.api is not None and parts.state.api.seen is not None:
            await parts.state.api.seen.aclose()
        await self.audit.close()  # every accepted record and usage event is on disk now
        if self.worker_task is not None:
            assert parts.state.outbox is not None
            if self.drain_deadline is not None:  # a drain delivers what is due first
                await parts.state.outbox.flush(grace)
            self.worker_task.cancel()  # undelivered events wait in the outbox for the next start
            await asyncio.wait({self.worker_task}, timeout=5)
        await self.upstream.aclose()
        if parts.state.gateway is not None:
            await parts.state.gateway.tenants.aclose()  # per-caller upstreams' pools
        await parts.local.aclose()  # every stdio process stopped, its group killed
        if parts.state.tracing is not None:  # the spans not yet exported, off the loop
            await asyncio.to_thread(parts.state.tracing.shutdown)
            parts.state.tracing = None
        if parts.connections is not None:
            await parts.connections.aclose()
        await self.mirrors.aclose()  # the reads in progress gave their connections back
        if self.keys is not None:
            self.keys.close()
        await parts.stores.aclose()
        parts.health.close()
        parts.database.close()


def _observer(request_log: RequestLog, metrics: Metrics | None, tracing: Observer | None,
              seen: Observer | None = None) -> Observer:
    """What watches each MCP message: metrics (when on), the request log line, the tracer
    (when on; last, so the log line's trace id is the span's) and what the servers' status
    keeps of their tools lists (proxy.seen)."""
    observers: list[Observer] = [request_log] if seen is None else [request_log, seen]
    if metrics is not None:
        observers.insert(0, metrics)
    if tracing is not None:
        observers.append(tracing)
    return Observers(observers)


SAMPLE_S = 5.0  # how often a worker of several refreshes its own gauges


async def _sample(metrics: Metrics, audit: AuditSink) -> None:
    while True:
        metrics.audit_depth.set(getattr(audit, "depth", 0))
        await asyncio.sleep(SAMPLE_S)


def _people_attributes(parts: Parts, accounts: Accounts) -> PeopleAttributes | None:
    """What fills a per-caller upstream's placeholder no claim does: the person's attributes
    (through the API's own Accounts, so a change made there applies to the next call)."""
    if not any(u.templated for u in parts.cfg.upstreams):
        return None
    return PeopleAttributes(accounts)


def _authenticator(parts: Parts, upstream: UpstreamClient, keys: KeyIndex | None
                   ) -> Authenticator:
    if keys is None:
        return NoAuth()
    people = LiveUsers(parts.web.accounts) \
        if parts.oauth is not None and parts.web is not None else None
    return BearerAuth(parts.cfg, parts.given.base_dir or Path.cwd(), upstream.http, keys,
                      parts.stores.lockouts, parts.given.clock, tollhouse=parts.oauth,
                      people=people)
