"""The decisions. Each policy is one small object with one async `check`; `default_policies`
returns them for a config, and the chain runs them by their `order` (access 100, rate limit 200,
egress 300, metering 500: last, so that a call denied by anything else is never billed)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from policies.metering import MeteringBackend
    from proxy.chain import Policy
    from proxy.config import Config


def default_policies(cfg: Config, metering: MeteringBackend | None = None) -> list[Policy]:
    """The policies this config asks for; a policy with nothing to decide is left out, so it
    costs nothing on the hot path. The imports are here, not at the top, because proxy.config
    embeds policy rules (policies.rate_limit): loading this package must not import the config
    back."""
    from policies.access import Access
    from policies.rate_limit import RateLimit
    from proxy.state.ratelimit import MemoryRateLimitStore

    policies: list[Policy] = []
    if Access.wanted(cfg):
        policies.append(Access(cfg))
    if cfg.rate_limits:
        policies.append(RateLimit(cfg.rate_limits, MemoryRateLimitStore(max_keys=100_000)))
    if metering is not None:
        from policies.metering import Metering

        policies.append(Metering(cfg.metering, metering))
    return policies
