"""What exists while the app serves: the upstream client, the audit sink, the compiled config
(proxy.compiled), the caller's identity, the registries, the management API and the MCP
gateway. `Serving.opened` builds each once, every collaborator given to its constructor, and
opens each on one `AsyncExitStack`: what was opened last is closed first, by construction, and
a start-up that fails half way closes what it had opened.

The close order that matters, and why it falls out of the open order: the gateway drains
first (opened last); the mirrors stop polling; the audit sink writes what it accepted before
the usage outbox's worker delivers it (the sink is built after the outbox it feeds); the
upstream client closes after the worker that posts through it; the mirrors' pool, the keys,
the stores and the database go last (opened first).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import AsyncIterator, Collection
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from policies.access import Access
from policies.cedar.book import TargetBook
from policies.guardrails import Hidden
from policies.metering import MeteringBackend
from proxy.api.context import Api
from proxy.approvals import Approvals
from proxy.audit import AuditRecord, AuditSink, DatabaseAuditSink
from proxy.audit import chain as audit_chain
from proxy.audit.checkpoint import Checkpoints, Signer
from proxy.audit.exports.service import Exports
from proxy.audit.outbox import OutboxWorker
from proxy.audit.retention import Retention
from proxy.auth.authenticator import Authenticator, BearerAuth, NoAuth
from proxy.auth.deprovisioned import Deprovisioned
from proxy.auth.group_roles import GroupRoles
from proxy.auth.keys import KeyIndex
from proxy.chain import Chain
from proxy.compiled import Deps, build_gate, compile
from proxy.config import MeteringConfig
from proxy.config.audit_chain import signing_key
from proxy.confine import Environment
from proxy.destinations import Destinations, SystemResolver, parse_addresses
from proxy.mcp.exchange import EdgeResponse
from proxy.mcp.gateway import Gateway
from proxy.mirror import Mirrors
from proxy.observability import Observer, Observers
from proxy.observability.health import Health
from proxy.observability.logs import RequestLog
from proxy.observability.metrics import Metrics
from proxy.people.deprovision import Deprovisioner
from proxy.people.live import LiveUsers
from proxy.pin_store import DatabasePins
from proxy.policy_store import PolicyStore
from proxy.runtime import reload
from proxy.seen import LastSeen
from proxy.seen_targets import stored_targets
from proxy.servers import Registry
from proxy.snapshot import Live
from proxy.state.sessions import RedisSessionStore
from proxy.storage.db import Database
from proxy.upstream import UpstreamClient
from proxy.upstream.tenants import Tenants
from proxy.virtual import VirtualRoute
from proxy.virtual.registry import Endpoints

if TYPE_CHECKING:
    from proxy.runtime.app import Services

log = logging.getLogger("tollhouse")
T = TypeVar("T")

DRAIN_POLL_S = 0.05  # how often a drain looks whether the calls in flight are done
SAMPLE_S = 5.0  # how often a worker of several refreshes its own gauges


class UsageOutbox:
    """The usage outbox's worker, as the audit sink that feeds it sees it: the sink is given
    `wake` and `deliver` when it is built, and the worker starts with the first metering
    backend (at start-up or by a reload) and follows each later one (`use`)."""

    def __init__(self, database: Database) -> None:
        self._database = database
        self.worker: OutboxWorker | None = None
        self._task: asyncio.Task[None] | None = None

    def wake(self) -> None:
        """From the audit writer's thread: usage events landed."""
        worker = self.worker
        if worker is not None:
            worker.wake_threadsafe()

    def deliver(self, record: AuditRecord) -> bool:
        """An in-process hook's delivery at once (OutboxWorker.deliver_now)."""
        worker = self.worker
        return worker is not None and worker.deliver_now(record)

    def use(self, backend: MeteringBackend | None, metering: MeteringConfig) -> None:
        if backend is None:
            return
        keep_s = metering.keep_delivered_h * 3600
        if self.worker is not None:
            self.worker.follow(backend, keep_s)
            return
        self.worker = OutboxWorker(self._database, backend, metering.retry_max_s,
                                   keep_delivered_s=keep_s)
        self._task = asyncio.get_running_loop().create_task(self.worker.run())

    async def close(self, grace_s: float | None) -> None:
        """Stop the worker (a drain, `grace_s` given, delivers what is due first); what is
        undelivered waits in the outbox for the next start."""
        if self._task is None or self.worker is None:
            return
        if grace_s is not None:
            await self.worker.flush(grace_s)
        self._task.cancel()
        await asyncio.wait({self._task}, timeout=5)


@dataclass
class Grace:
    """What a close gives the calls in flight: what the drain (SIGTERM) left of its grace and
    a moment more, else `server.shutdown_grace_s`."""

    shutdown_s: float
    deadline: float | None = None  # the loop's time a drain's grace ends at

    def left(self) -> float:
        if self.deadline is None:
            return self.shutdown_s
        return max(self.deadline - asyncio.get_running_loop().time(), 1.0)

    def drained(self) -> float | None:
        """The grace left after a drain, None without one (then nothing waits)."""
        return None if self.deadline is None else self.left()


class Serving:
    """What exists while the app serves. `draining` (true from the moment `drain` begins, on
    SIGTERM) is what /readyz and the MCP edge's refusals read: one flag, the gateway's."""

    def __init__(self, services: Services, *, grace: Grace, deps: Deps, upstream: UpstreamClient,
                 audit: AuditSink, outbox: UsageOutbox | None, health: Health,
                 gateway: Gateway, registry: Registry, endpoints: Endpoints, api: Api,
                 tracing: Any = None) -> None:
        self.services = services
        self.deps = deps  # what every compiled config is built with (proxy.compiled)
        self.upstream = upstream
        self.audit = audit
        self.outbox = outbox  # None where the audit sink is not this app's database's
        self.health = health
        self.gateway = gateway
        self.registry = registry
        self.endpoints = endpoints  # the virtual endpoints (proxy.virtual.registry)
        self.api = api
        self.tracing = tracing  # proxy.observability.tracing.Tracing with tracing on
        self.grace = grace

    @classmethod
    @asynccontextmanager
    async def opened(cls, services: Services) -> AsyncIterator[Serving]:
        async with AsyncExitStack() as stack:
            serving = await _open(services, stack)
            stack.push_async_callback(serving._drained)  # the first thing done at close
            sampler = _sampler(services.metrics, serving.audit)
            if sampler is not None:
                stack.callback(sampler.cancel)
            yield serving

    @property
    def draining(self) -> bool:
        return self.gateway.draining

    @draining.setter
    def draining(self, value: bool) -> None:
        self.gateway.draining = value

    def policies_changed(self) -> None:
        """The API's policies changed (here, or on another gateway: the mirror): the Cedar
        gate joins the chain when it has its first policy, and leaves it with its last, so a
        gateway without policies pays nothing for the gate. Nothing awaits."""
        live = self.gateway.live
        gate = live.gate
        if gate is None:
            return
        present = any(p is gate for p in live.chain.policies)
        if gate.active == present:
            return
        others = [p for p in live.chain.policies if p is not gate]
        chain = Chain(others if present else [*others, gate])
        self.gateway.live = dataclasses.replace(live, chain=chain)

    def swap(self, live: Live, gone: Collection[str] = ()) -> None:
        """`live`'s routes served, the upstreams in `gone` no more, the registries rebased on
        its config and the snapshot the next call reads swapped in. Nothing awaits: a reload
        calls this inside the registry's `changing()`."""
        routes, destinations = self.services.routes, self.deps.destinations
        for name in gone:
            routes.pop(name, None)
            destinations.discard(name)
        routes.update(live.routes)
        self.registry.rebase(live.cfg)
        self.endpoints.rebase(live.cfg)
        self.gateway.live = live  # the snapshot a call reads once, as it starts (proxy.snapshot)

    async def drain(self, grace_s: float) -> float:
        """SIGTERM: refuse what is new and end the GET streams at once, then wait up to
        `grace_s` for the calls in flight; the seconds of grace left."""
        loop = asyncio.get_running_loop()
        deadline = self.grace.deadline = loop.time() + grace_s
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

    async def _drained(self) -> None:
        await self.gateway.drain(self.grace.left())

    async def reload(self, path: Path, env: Environment | None = None) -> bool:
        """SIGHUP: the config file at `path` applied from the next call (proxy.runtime.reload), its
        `${VAR}`s read from `env` (os.environ without it)."""
        return await reload.reload(self, path, env)


async def _open(s: Services, stack: AsyncExitStack) -> Serving:
    """Everything `Serving` holds, each closed (by `stack`) in the reverse of this order."""
    cfg, given, database = s.cfg, s.given, s.database
    grace = Grace(cfg.server.shutdown_grace_s)
    stack.callback(database.close)
    stack.push_async_callback(s.stores.aclose)
    mirrors = Mirrors(given.registry_poll_s)  # servers, endpoints, pins, keys, policies
    identity = _identity(s, mirrors, stack)  # the API keys, who is deprovisioned
    stack.push_async_callback(mirrors.aclose)  # once the reads in progress gave theirs back
    if s.connections is not None:
        stack.push_async_callback(s.connections.aclose)
    tracing = _tracing(s)
    if tracing is not None:  # the spans not yet exported, off the loop
        stack.push_async_callback(asyncio.to_thread, tracing.shutdown)
    stack.push_async_callback(s.local.aclose)  # every stdio process stopped, its group killed
    added_access, added_destinations = Access.published(), Destinations.published()
    destinations = Destinations((), given.resolver or SystemResolver(),
                                parse_addresses(cfg.egress.metadata_addresses),
                                added=added_destinations)
    upstream = UpstreamClient(given.upstream_transport, destinations=destinations)
    stack.push_async_callback(upstream.aclose)
    audit, outbox, exports = _audit(s)
    if outbox is not None:  # after the sink closed: it delivers what the sink wrote
        stack.push_async_callback(lambda: outbox.close(grace.drained()))
    if exports is not None:  # stopped after the sink closed (what it wrote waits for them)
        exports.start()
        stack.push_async_callback(exports.close)
    stack.push_async_callback(audit.close)  # every accepted record and usage event on disk
    seen = LastSeen(database, s.routes.__contains__)
    stack.push_async_callback(seen.aclose)
    pin_store = DatabasePins(database, mirrors)  # read at start-up, then kept in step
    stack.push_async_callback(pin_store.aclose)
    health = Health(database, s.stores, s.metrics, audit)
    stack.callback(health.close)
    deps = Deps(destinations, s.trusted, s.local, upstream.http, s.metrics,
                s.stores.rate_limits, pin_store.pins, Hidden(), added_access,
                book=TargetBook(stored_targets(database)[0]),  # as last seen
                attributes_of=s.people.attributes if s.people is not None else None,
                database=database,
                policies=PolicyStore(database, mirrors),  # the API's Cedar policies, polled
                approvals=s.stores.approvals, wall_clock=s.given.wall_clock)
    live = compile(cfg, deps, gate=build_gate(cfg, s.base_dir, deps))
    s.routes.update(live.routes)
    virtual = {e.name: VirtualRoute.from_config(e) for e in cfg.endpoints}
    built: Late[Gateway] = Late()  # the per-caller upstreams close what a reload replaced
    tenants = Tenants(destinations, upstream.pool, lambda c: built().spawn(c), s.people)
    gateway = built.bind(_gateway(s, live, upstream, audit, identity, virtual, tracing, seen,
                                  tenants))
    stack.push_async_callback(gateway.tenants.aclose)  # per-caller upstreams' pools
    gateway.calls.approvals = approvals = Approvals(s.stores.approvals, audit, public_url=cfg.server.public_url,
                                  make_response=EdgeResponse, webhook=cfg.approvals_webhook,
                                  http=upstream.http, spawn=gateway.spawn)
    stack.push_async_callback(approvals.aclose)
    gateway.virtual.learning(seen.listed)  # a member's lists are kept as its own are
    changed = partial(gateway.virtual.members_changed, virtual)
    registry = Registry(cfg, s.routes, mirrors, added_access, added_destinations, database,
                        reserved=virtual.__contains__, changed=changed)
    endpoints = Endpoints(cfg, virtual, registry, mirrors, added_access, database,
                          changed=changed)
    api = _api(s, registry, endpoints, identity.keys, audit, pin_store, seen)
    api.group_roles = identity.group_roles  # /api/v1/group-roles
    _deprovisioning(s, api, audit, approvals, identity)
    api.approvals, api.edge = approvals, gateway.auth  # /api/v1/approvals' deciders
    serving = Serving(s, grace=grace, deps=deps, upstream=upstream, audit=audit, outbox=outbox,
                      health=health, gateway=gateway, registry=registry, endpoints=endpoints,
                      api=api, tracing=tracing)
    if outbox is not None:
        outbox.use(live.backend, cfg.metering)
    if deps.policies is not None:
        deps.policies.listen(serving.policies_changed)
    retention = _retention(s)
    if retention is not None:  # (its pass in progress ends before the database closes)
        pruning = asyncio.get_running_loop().create_task(retention.run())
        stack.push_async_callback(_stopped, pruning)
    mirrors.start()  # what other processes change: servers, endpoints, pins, polled
    stack.push_async_callback(mirrors.stop)
    await seen.start()
    await s.stores.start()
    approvals.start()  # decisions heard from every replica; expiries swept
    return serving


def _audit(s: Services) -> tuple[AuditSink, UsageOutbox | None, Exports | None]:
    """The audit sink (a test's, else this database's) and, for the database's, the usage
    outbox it feeds and the audit exports (`[[audit.exports]]`) it queues records for."""
    if s.given.audit_sink is not None:
        return s.given.audit_sink, None, None
    database, cfg = s.database, s.cfg
    sqlite_file = database.path if database.dialect == "sqlite" and not database.memory \
        else None
    outbox = UsageOutbox(database)
    metrics = s.metrics
    exports = Exports(database, cfg.audit.exports, metrics) if cfg.audit.exports else None
    audit = DatabaseAuditSink(
        database, journal=cfg.database.journal(sqlite_file),
        commit_window_s=cfg.database.audit_commit_window_ms / 1000,
        on_outbox=outbox.wake, deliver=outbox.deliver, checkpoints=_checkpoints(s),
        on_fallback=metrics.audit_fallback.inc if metrics is not None else None,
        exports=exports.queue if exports is not None else None)
    return audit, outbox, exports


def _signer(s: Services) -> Signer | None:
    """The audit chain's signing key, with the chain on (checked when the config loaded)."""
    chain = s.cfg.audit.chain
    return Signer(signing_key(chain, s.base_dir)) if chain.enabled else None


def _checkpoints(s: Services) -> Checkpoints | None:
    """With the chain on: this process's audit chain, a new one each start, and the
    checkpoints its writer signs (proxy.audit.chain)."""
    signer = _signer(s)
    if signer is None:
        return None
    return Checkpoints(s.database, signer, audit_chain.Chain(), s.cfg.audit.chain.checkpoint_every_s)


def _retention(s: Services) -> Retention | None:
    """The task removing records older than `[audit] retention_days` (none: 0)."""
    days = s.cfg.audit.retention_days
    if not days or s.given.audit_sink is not None:
        return None
    return Retention(s.database, days, _signer(s))


async def _stopped(task: asyncio.Task[None]) -> None:
    task.cancel()
    await asyncio.wait({task}, timeout=10)


def _tracing(s: Services) -> Any:
    if not s.cfg.observability.otlp_endpoint:
        return None
    from proxy.observability.tracing import Tracing  # the extra is there: the config check

    return Tracing(s.cfg.observability, s.given.span_exporter)


def _gateway(s: Services, live: Live, upstream: UpstreamClient, audit: AuditSink,
             identity: Identity, virtual: dict[str, VirtualRoute], tracing: Any,
             seen: LastSeen, tenants: Tenants) -> Gateway:
    stores, metrics = s.stores, s.metrics
    return Gateway(
        routes=s.routes, authenticator=_authenticator(s, upstream, identity), live=live,
        sessions=stores.sessions, inflight=stores.inflight, upstream=upstream, audit=audit,
        allowed_origins=s.origins, identity=s.identity, connections=s.connections,
        trusted_proxies=s.trusted, bridged=stores.bridge, later=s.given.later,
        observer=_observer(s.request_log, metrics, tracing, seen),
        session_ended=metrics.session_ended if metrics is not None else None,
        tenants=tenants, endpoints=virtual, cursor_key=s.cursor_key,
        max_response_bytes=s.cfg.server.max_response_bytes, resumable=stores.resumable,
        tasks=stores.tasks)


class Late(Generic[T]):
    """One end of a cycle of two: handed to the object built first, bound to the second once
    that is built (before either serves)."""

    def __init__(self) -> None:
        self._value: T | None = None

    def bind(self, value: T) -> T:
        self._value = value
        return value

    def __call__(self) -> T:
        assert self._value is not None, "read before it was bound"
        return self._value


def _api(s: Services, registry: Registry, endpoints: Endpoints, keys: KeyIndex | None,
         audit: AuditSink, pin_store: DatabasePins, seen: LastSeen) -> Api:
    sessions = s.stores.sessions
    return Api(registry, keys, s.database, s.web, s.stores.lockouts, s.accounts,
               forget_person=s.connections.forget if s.connections is not None else None,
               trusted_proxies=s.trusted, pins=pin_store.pins, pin_store=pin_store,
               audit=audit, endpoints=endpoints, seen=seen, sessions=sessions,
               sessions_scope="cluster" if isinstance(sessions, RedisSessionStore)
               else "process")


def _authenticator(s: Services, upstream: UpstreamClient, identity: Identity
                   ) -> Authenticator:
    if identity.keys is None:
        return NoAuth()
    people = LiveUsers(s.web.accounts) if s.oauth is not None and s.web is not None else None
    return BearerAuth(s.cfg, s.base_dir, upstream.http, identity.keys, s.stores.lockouts,
                      s.given.clock, tollhouse=s.oauth, people=people,
                      deprovisioned=identity.deprovisioned, group_roles=identity.group_roles)


@dataclass(frozen=True)
class Identity:
    """What callers are known by beside the config, mirrored from the database: the API keys
    and who is deprovisioned (proxy.auth.deprovisioned); neither without auth.mode = "jwt".
    And the groups mapped to roles (proxy.auth.group_roles), /api/v1/group-roles' table."""

    keys: KeyIndex | None
    deprovisioned: Deprovisioned | None
    group_roles: GroupRoles


def _identity(s: Services, mirrors: Mirrors, stack: AsyncExitStack) -> Identity:
    group_roles = GroupRoles(s.database, mirrors,
                             [(m.group, m.role) for m in s.cfg.auth.group_roles])
    stack.callback(group_roles.close)
    if s.cfg.auth.mode != "jwt":
        return Identity(None, None, group_roles)
    keys, deprovisioned = KeyIndex(s.database, mirrors), Deprovisioned(s.database, mirrors)
    stack.callback(keys.close)
    stack.callback(deprovisioned.close)
    return Identity(keys, deprovisioned, group_roles)


def _deprovisioning(s: Services, api: Api, audit: AuditSink, approvals: Approvals,
                    identity: Identity) -> None:
    """What a person deprovisioned loses (proxy.people.deprovision), taken by SCIM's changes
    and by /api/v1/users' deletes."""
    taker = Deprovisioner(s.database, s.accounts, s.stores.sessions, audit,
                          identity.deprovisioned,
                          browser=s.web.sessions if s.web is not None else None,
                          grants=s.oauth, connections=s.connections, approvals=approvals)
    api.deprovision = taker
    if s.scim is not None:
        s.scim.store.changes = taker


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


def _sampler(metrics: Metrics | None, audit: AuditSink) -> asyncio.Task[None] | None:
    """One of several workers: its own gauges reach a scrape on any of them."""
    if metrics is None or metrics.multiproc_dir is None:
        return None
    return asyncio.get_running_loop().create_task(_sample(metrics, audit))


async def _sample(metrics: Metrics, audit: AuditSink) -> None:
    while True:
        metrics.audit_depth.set(getattr(audit, "depth", 0))
        await asyncio.sleep(SAMPLE_S)

