"""Rate limits: named rules, each a GCRA bucket per key (principal, endpoint, tool, API key).

Every rule that matches a call applies, and they are decided together in one `store.take`:
the call passes only if every bucket admits it, and a refused call charges none of them, so a
caller held back by one rule does not also drain the others while retrying.

`proxy.config` embeds `RateLimitRule`, so this module imports the chain's types for annotations
only: at run time it needs nothing that imports the config back.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

from proxy.errors import RateLimited
from proxy.state.ratelimit import US, Limit, RateLimitStore

if TYPE_CHECKING:
    from proxy.chain import CallContext
    from proxy.jsonrpc import McpMessage

KEY_KINDS = ("principal", "principal_endpoint", "principal_tool", "endpoint", "api_key")
_PERIODS_S = {"s": 1, "min": 60, "h": 3600}
_RATE = re.compile(r"^([1-9][0-9]{0,9})/(s|min|h)$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")  # no ':', which delimits bucket keys


@dataclass(frozen=True)
class RateLimitRule:
    """One `[[rate_limits]]` table. `burst` is how many calls may arrive at once after a quiet
    spell; 0 means the rate's own count, so "100/h" lets the hour's 100 calls come together,
    as "100 per hour" reads. A burst of 1 spaces every call evenly."""

    name: str
    key: str = "principal"
    methods: list[str] = field(default_factory=lambda: ["tools/call"])
    rate: str = "10/s"
    burst: int = 0
    endpoints: list[str] = field(default_factory=list)


def parse_rate(rate: str) -> tuple[int, int]:
    """'10/s' -> (10, 1): calls per period of that many seconds."""
    match = _RATE.match(rate)
    if match is None:
        raise ValueError(f"{rate!r} is not n/s, n/min or n/h")
    return int(match.group(1)), _PERIODS_S[match.group(2)]


def validate_rules(rules: list[RateLimitRule],
                   known_endpoints: Collection[str] | None = None) -> None:
    """Raise ValueError naming the first offending rule and field; with `known_endpoints`, an
    endpoint no upstream has is refused too (a typo there would silently limit nothing)."""
    seen: dict[str, int] = {}
    for i, rule in enumerate(rules):
        where = f"rate_limits[{i}]"
        if not _NAME.match(rule.name):
            raise ValueError(f"{where}.name: {rule.name!r} must be 1-64 letters, digits, '-', "
                             "'_' or '.', starting with a letter or digit")
        if rule.name in seen:
            raise ValueError(f"{where}.name: {rule.name!r} repeats rate_limits[{seen[rule.name]}]")
        seen[rule.name] = i
        if rule.key not in KEY_KINDS:
            raise ValueError(f"{where}.key: {rule.key!r} is not one of {', '.join(KEY_KINDS)}")
        if not rule.methods or not all(rule.methods):
            raise ValueError(f"{where}.methods: must list at least one method, none empty")
        if rule.key == "principal_tool" and "tools/call" not in rule.methods:
            raise ValueError(f"{where}.key: 'principal_tool' needs 'tools/call' in methods")
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


@dataclass(frozen=True, slots=True)
class _Compiled:
    """A rule with everything `check` needs precomputed."""

    name: str
    reason: str
    key: str
    endpoints: frozenset[str]
    interval_us: int
    tolerance_us: int

    def bucket(self, call: McpMessage, ctx: CallContext) -> str | None:
        """The bucket key for this call, or None when the call lacks what the key needs.
        Only the principal key and the tool are free text; the tool is length-prefixed and
        the principal comes last, so no two callers share a key by crafting either."""
        kind = self.key
        if kind == "principal":
            return f"rl:{self.name}:{ctx.principal.key}"
        if kind == "principal_endpoint":
            return f"rl:{self.name}:{ctx.endpoint}:{ctx.principal.key}"
        if kind == "principal_tool":
            tool = call.tool
            if tool is None:
                return None
            return f"rl:{self.name}:{len(tool)}:{tool}:{ctx.principal.key}"
        if kind == "endpoint":
            return f"rl:{self.name}:{ctx.endpoint}"
        return None if ctx.api_key_id is None else f"rl:{self.name}:{ctx.api_key_id}"


class RateLimit:
    name: ClassVar[str] = "rate_limit"
    order: ClassVar[int] = 200

    def __init__(self, rules: list[RateLimitRule], store: RateLimitStore) -> None:
        validate_rules(rules)
        self._store = store
        self._by_method: dict[str, list[_Compiled]] = {}
        for rule in rules:
            count, period_s = parse_rate(rule.rate)
            interval_us = period_s * US // count
            tolerance_us = ((rule.burst or count) - 1) * interval_us
            compiled = _Compiled(rule.name, f"rate_limit: {rule.name}", rule.key,
                                 frozenset(rule.endpoints), interval_us, tolerance_us)
            for method in dict.fromkeys(rule.methods):
                self._by_method.setdefault(method, []).append(compiled)

    async def check(self, call: McpMessage, ctx: CallContext) -> None:
        rules = self._by_method.get(call.method or "")
        if not rules:
            return
        matched: list[_Compiled] = []
        limits: list[Limit] = []
        for rule in rules:
            if rule.endpoints and ctx.endpoint not in rule.endpoints:
                continue
            key = rule.bucket(call, ctx)
            if key is not None:
                matched.append(rule)
                limits.append(Limit(key, rule.interval_us, rule.tolerance_us))
        if not limits:
            return
        refused = await self._store.take(limits)
        if refused is not None:
            raise RateLimited(matched[refused.position].reason, refused.retry_after_s)
