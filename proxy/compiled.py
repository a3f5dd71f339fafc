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

from dataclasses import dataclass
from typing import Any

import httpx

from policies import build_egress, default_policies
from policies.access import Access
from policies.guardrails import Hidden
from policies.guardrails.pinning import Pins
from policies.metering import MeteringBackend
from proxy.chain import Chain
from proxy.config import Config
from proxy.destinations import Destinations, IPNetwork
from proxy.metering_backends import build_backend
from proxy.observability.metrics import Metrics, timed
from proxy.published import Published
from proxy.snapshot import Live
from proxy.state.ratelimit import RateLimitStore
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


def compile(cfg: Config, deps: Deps, before: Live | None = None) -> Live:
    """Everything a call needs of `cfg`. `before`, the snapshot it replaces: its metering
    backend is kept when `[metering]` did not change (a webhook's client, a hook's module)."""
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
                                   hidden=deps.hidden, added_access=deps.added_access))
    access = next((p for p in chain.policies if isinstance(p, Access)), None)
    return Live(cfg, chain, routes, backend, access)
