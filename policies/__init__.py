"""The decisions. Each policy is one small object with one async `check`; `default_policies`
returns them for a config, and the chain runs them by their `order` (access 100, rate limit 200,
egress 300, metering 500: last, so that a call denied by anything else is never billed)."""

from __future__ import annotations

from policies.access import Access
from proxy.chain import Policy
from proxy.config import Config


def default_policies(cfg: Config) -> list[Policy]:
    """The policies this config asks for; a policy with nothing to decide is left out, so it
    costs nothing on the hot path."""
    policies: list[Policy] = []
    if Access.wanted(cfg):
        policies.append(Access(cfg))
    return policies
