"""One config compiled into the `Live` snapshot a call reads (proxy.snapshot): start-up
(proxy.runtime.serving) and a SIGHUP reload (proxy.runtime.reload) both call `compile`, so what a reload
builds is what start-up built, by the same code.

`Deps` is what a snapshot is built with and what outlives it: the egress destinations the
upstream client dials through, the stdio processes, the rate limits' store, the guardrails'
pins and what they hid, the tables the management API publishes its rules in. They are made
once, at start-up, and every snapshot gets the same ones.

`compile` is synchronous: a reload calls it inside the registry's `changing()`, where nothing
awaits, so no call sees half of it.
"""

from __future__ import annotations

import ipaddress
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from policies import build_egress, default_policies
from policies.access import Access
from policies.approvals import Approvals
from policies.cedar.book import TargetBook
from policies.cedar.gate import Gate
from policies.cedar.load import PolicyError, read_policies
from policies.guardrails import Hidden
from policies.guardrails.pinning import Pins
from policies.metering import MeteringBackend
from proxy.auth.principal import Principal
from proxy.chain import Chain
from proxy.config import Config, ConfigError
from proxy.destinations import Destinations, IPNetwork, classify
from proxy.metering_backends import build_backend
from proxy.observability.metrics import Metrics, timed
from proxy.policy_store import PolicyStore
from proxy.published import Published
from proxy.seen_targets import stored_targets
from proxy.snapshot import Live
from proxy.state.approvals import ApprovalStore
from proxy.state.ratelimit import RateLimitStore
from proxy.storage.db import Database
from proxy.upstream import UpstreamRoute
from proxy.upstream.stdio import LocalUpstreams


@dataclass(frozen=True)
class Deps:
    destinations: Destinations  # the egress policy's and the upstream client's, one table
    trusted: tuple[IPNetwork, ...]  # server.trusted_proxies, parsed
    local: LocalUpstreams  # the stdio upstreams' processes (a route's transport)
    http: httpx.AsyncClient  # what a metering webhook posts with (the upstream client's)
    metrics: Metrics | None
    rate_limits: RateLimitStore | None
    pins: Pins | None
    hidden: Hidden | None
    added_access: Published[Any]  # the API's access rules, which its registries publish
    # the tools and prompts the Cedar policies are validated against, learned from lists
    book: TargetBook = field(default_factory=TargetBook)
    # a person's attributes (principal.attributes in Cedar), when the users table is read
    attributes_of: Callable[[Principal], Awaitable[Mapping[str, Any]]] | None = None
    database: Database | None = None  # where the users' attribute names are read
    # the Cedar policies created through /api/v1/policies (None: not managed here)
    policies: PolicyStore | None = None
    # where approvals are kept (proxy.state.approvals): needed when [[approvals]] are set
    approvals: ApprovalStore | None = None
    # the wall clock approvals are made by (the memory approval store's: tests move both)
    wall_clock: Callable[[], float] = time.time


def build_gate(cfg: Config, base_dir: Path, deps: Deps) -> Gate | None:
    """The Cedar policies of `[policy]`, read from their files (relative to `base_dir`, the
    config file's directory) and validated against the targets known, with those of the
    management API (`deps.policies`: a fault of theirs refuses what they govern, never the
    load). None without files and without the API's store; with the store, a gate even
    while it holds no policy: it governs no endpoint and costs a call one method call, and
    the API's first policy takes effect without a restart.
    Raises ConfigError with one line naming the file, the policy and the problem. Reads
    files and the users table: start-up, or a reload off the event loop, before `compile`."""
    if not cfg.policy.files and deps.policies is None:
        return None
    attributes: list[str] = []
    if deps.database is not None:
        attributes = stored_targets(deps.database)[1]
    try:
        policies = read_policies(cfg.policy.files, base_dir, cfg.policy.mode) \
            if cfg.policy.files else []
        return Gate(policies, deps.book, claims=cfg.policy.claims, attributes=attributes,
                    zone_of=zone_of, attributes_of=deps.attributes_of,
                    added=deps.policies, mode=cfg.policy.mode)
    except PolicyError as exc:
        raise ConfigError(str(exc)) from None


def preflight(cfg: Config, base_dir: Path) -> None:
    """Start-up's check of the Cedar policies, before anything serves: ConfigError (one
    line, exit 2) for a policy that does not validate against the tools as last seen."""
    if not cfg.policy.files:
        return
    with Database(cfg.database.url, busy_timeout_s=cfg.database.busy_timeout_s) as database:
        targets, attributes = stored_targets(database)
    try:
        Gate(read_policies(cfg.policy.files, base_dir, cfg.policy.mode), TargetBook(targets),
             claims=cfg.policy.claims, attributes=attributes)
    except PolicyError as exc:
        raise ConfigError(str(exc)) from None


def build_approvals(cfg: Config, deps: Deps, gate: Gate | None) -> Approvals | None:
    """The approval gate of `[[approvals]]` (None without rules); ConfigError, one line, for
    a `when` that is not a valid Cedar condition."""
    if not cfg.approvals:
        return None
    if deps.approvals is None:
        raise ValueError("approvals are configured but no approval store was given")
    base = cfg.server.public_url.rstrip("/")
    try:
        return Approvals(cfg.approvals, deps.approvals, deps.book,
                         link=lambda approval_id: f"{base}/console/approvals/{approval_id}",
                         claims=cfg.policy.claims,
                         cedar_version=(lambda: gate.version) if gate is not None else str,
                         clock=deps.wall_clock)
    except PolicyError as exc:
        raise ConfigError(str(exc)) from None


def zone_of(ip: str | None) -> str:
    """The caller's network zone (loopback, lan, remote) of its address; "" when unknown."""
    if not ip:
        return ""
    try:
        return classify(ipaddress.ip_address(ip))
    except ValueError:
        return ""


def compile(cfg: Config, deps: Deps, before: Live | None = None,
            gate: Gate | None = None) -> Live:
    """Everything a call needs of `cfg`. `before`, the snapshot it replaces: its metering
    backend is kept when `[metering]` did not change (a webhook's client, a hook's module).
    `gate`: the Cedar policies `build_gate` read for it (None: no `[policy] files`)."""
    backend: MeteringBackend | None
    if before is not None and before.cfg.metering == cfg.metering:
        backend = before.backend
    else:
        backend = timed(build_backend(cfg.metering, deps.http), deps.metrics) \
            if cfg.metering.enabled else None
    routes = {u.name: UpstreamRoute.from_config(u, deps.local.transport(u))
              for u in cfg.upstreams}
    egress = build_egress(cfg, deps.destinations, deps.trusted)
    chain = Chain(default_policies(cfg, metering=backend, egress=egress,
                                   rate_limits=deps.rate_limits, pins=deps.pins,
                                   hidden=deps.hidden, added_access=deps.added_access,
                                   cedar=gate if gate is not None and gate.active else None,
                                   approvals=build_approvals(cfg, deps, gate)))
    access = next((p for p in chain.policies if isinstance(p, Access)), None)
    return Live(cfg, chain, routes, backend, access, gate)
