"""The decisions. Each policy is one small object with one async `check`; `default_policies`
returns them for a config, and the chain runs them by their `order` (access 100, rate limit 200,
egress 300, metering 500: last, so that a call denied by anything else is never billed)."""

from __future__ import annotations

from proxy.chain import Policy
from proxy.config import Config


def default_policies(cfg: Config) -> list[Policy]:
    """The policies this config asks for, in chain order. None yet: the access, rate-limit,
    egress and metering policies arrive with their issues."""
    return []
