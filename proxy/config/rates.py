"""`[[rate_limits]]`: the rate grammar ("10/s", "100/h"), the bucket keys, and the rules'
checks. policies/rate_limit.py parses its rules with `parse_rate`, and proxy.state.ratelimit
counts in `US`, so what the check accepts is what the limiter can count."""

from __future__ import annotations

import re
import typing

from proxy.config.errors import ConfigError
from proxy.config.values import NAME

if typing.TYPE_CHECKING:
    from proxy.config.tables import Config, RateLimitRule

US = 1_000_000  # the limiter's clock ticks: microseconds
# `actor`: the agent acting for a person (a token from token exchange, RFC 8693 `act`); a call
# with no actor is not counted by such a rule
RATE_LIMIT_KEYS = ("principal", "principal_endpoint", "principal_tool", "endpoint", "api_key",
                   "actor", "actor_endpoint")
# the methods a `principal_tool` bucket has a tool for: a call, and the requests of a task (by
# the task's tool, proxy.mcp.tasks)
TOOL_METHODS = ("tools/call", "tasks/get", "tasks/result", "tasks/cancel")
_PERIODS_S = {"s": 1, "min": 60, "h": 3600}
_RATE = re.compile(r"^([1-9][0-9]{0,9})/(s|min|h)$")


def check(cfg: Config) -> None:
    try:
        validate_rules(cfg.rate_limits, known_endpoints={u.name for u in cfg.upstreams})
    except ValueError as exc:
        raise ConfigError(f"config: {exc}") from None


def parse_rate(rate: str) -> tuple[int, int]:
    """'10/s' -> (10, 1): calls per period of that many seconds."""
    match = _RATE.match(rate)
    if match is None:
        raise ValueError(f"{rate!r} is not n/s, n/min or n/h")
    return int(match.group(1)), _PERIODS_S[match.group(2)]


def validate_rules(rules: list[RateLimitRule],
                   known_endpoints: typing.Collection[str] | None = None) -> None:
    """Raise ValueError naming the first offending rule and field; with `known_endpoints`, an
    endpoint no upstream has is refused too (a typo there would silently limit nothing)."""
    seen: dict[str, int] = {}
    for i, rule in enumerate(rules):
        where = f"rate_limits[{i}]"
        if not NAME.match(rule.name):  # no ':', which delimits bucket keys
            raise ValueError(f"{where}.name: {rule.name!r} must be 1-64 letters, digits, '-', "
                             "'_' or '.', starting with a letter or digit")
        if rule.name in seen:
            raise ValueError(f"{where}.name: {rule.name!r} repeats rate_limits[{seen[rule.name]}]")
        seen[rule.name] = i
        if rule.key not in RATE_LIMIT_KEYS:
            raise ValueError(f"{where}.key: {rule.key!r} is not one of "
                             f"{', '.join(RATE_LIMIT_KEYS)}")
        if not rule.methods or not all(rule.methods):
            raise ValueError(f"{where}.methods: must list at least one method, none empty")
        if rule.key == "principal_tool" and not set(rule.methods) & set(TOOL_METHODS):
            raise ValueError(f"{where}.key: 'principal_tool' needs 'tools/call' in methods (or "
                             "a request of a task: tasks/get, tasks/result, tasks/cancel)")
        try:
            count, period_s = parse_rate(rule.rate)
        except ValueError as exc:
            raise ValueError(f"{where}.rate: {exc}") from None
        if period_s * US // count == 0:
            raise ValueError(f"{where}.rate: {rule.rate!r} is more than one call per microsecond")
        if rule.burst < 0:
            raise ValueError(f"{where}.burst: {rule.burst} must be 0 (the rate's count) or more")
        for endpoint in rule.endpoints:
            if known_endpoints is not None and endpoint not in known_endpoints:
                raise ValueError(f"{where}.endpoints: {endpoint!r} is not a configured upstream")
