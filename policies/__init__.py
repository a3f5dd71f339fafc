"""The decisions. Each policy is one small object with one async `check`; `default_policies`
returns them for a config, and the chain runs them by their `order` (access 100, rate limit 200,
egress 300, guardrails 400, approvals 450, metering 500: last, so that a call denied by anything else is never billed).

A policy gets what it needs from the mechanism as an interface (a rate-limit store, the egress
destinations, a metering backend), so nothing here imports a web framework, an HTTP client or
a database driver (tests/policies/test_imports.py)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from policies.access import Access
from policies.egress import Destinations, Egress, UpstreamEgress
from policies.guardrails import Guardrails, Hidden
from policies.guardrails.pinning import Pins
from policies.metering import Metering, MeteringBackend
from policies.rate_limit import RateLimit

if TYPE_CHECKING:
    from proxy.chain import Policy
    from proxy.config import Config
    from proxy.destinations import IPNetwork
    from proxy.published import Published
    from proxy.state.ratelimit import RateLimitStore


def build_egress(cfg: Config, destinations: Destinations,
                 trusted_proxies: Sequence[IPNetwork]) -> Egress:
    """Always on: the zone and metadata-address rules hold even without an [egress] table.
    `destinations` is `proxy.destinations.Destinations`, which the upstream client dials through
    too; `trusted_proxies` are `server.trusted_proxies`, parsed."""
    return Egress(cfg.egress,
                  [UpstreamEgress.local(u.name, u.collections) if u.stdio else
                   UpstreamEgress.from_url(u.name, u.url, u.zones, u.collections)
                   for u in cfg.upstreams],
                  destinations, trusted_proxies)


def default_policies(cfg: Config, metering: MeteringBackend | None = None,
                     egress: Egress | None = None,
                     rate_limits: RateLimitStore | None = None,
                     pins: Pins | None = None, hidden: Hidden | None = None,
                     added_access: Published[Any] | None = None,
                     cedar: Policy | None = None,
                     approvals: Policy | None = None) -> list[Policy]:
    """The policies this config asks for; a policy with nothing to decide is left out, so it
    costs nothing on the hot path. `rate_limits` is the buckets' store, built with the other
    live state at start-up (proxy.state.open_stores); it is needed when the config has rate
    limits. `added_access` is where the management API's registries publish the rules of
    what they add (`Access.published()`), the same table across reloads."""
    policies: list[Policy] = []
    if Access.wanted(cfg) or cfg.auth.mode == "jwt":  # the API may add rules at run time
        policies.append(Access(cfg, added_access))
    if cedar is not None:  # `[policy]`: Cedar, built by proxy.compiled.build_gate
        policies.append(cedar)
    if cfg.rate_limits:
        if rate_limits is None:
            raise ValueError("rate limits are configured but no rate-limit store was given")
        policies.append(RateLimit(cfg.rate_limits, rate_limits))
    if egress is not None:
        policies.append(egress)
    if Guardrails.wanted(cfg):
        policies.append(Guardrails(cfg, pins, hidden))
    if approvals is not None:  # `[[approvals]]`, built by proxy.compiled.build_approvals
        policies.append(approvals)
    if metering is not None:
        policies.append(Metering(cfg.metering, metering))
    return policies
