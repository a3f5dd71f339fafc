"""Rate limits: named rules, each a GCRA bucket per key (principal, endpoint, tool, API key, the
actor acting for a person).

Every rule that matches a call applies, and they are decided together in one `store.take`:
the call passes only if every bucket admits it, and a refused call charges none of them, so a
caller held back by one rule does not also drain the others while retrying.

The rules are `[[rate_limits]]` tables (`proxy.config.RateLimitRule`), validated there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from proxy.config import RateLimitRule, parse_rate, validate_rules
from proxy.config.rates import US
from proxy.errors import RateLimited
from proxy.state.ratelimit import Limit, RateLimitStore

if TYPE_CHECKING:
    from proxy.chain import CallContext
    from proxy.jsonrpc import McpMessage


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
        if kind in ("actor", "actor_endpoint"):  # an agent acting for someone, whoever it is
            actor = ctx.principal.actor
            if not actor:
                return None
            where = f"{ctx.endpoint}:" if kind == "actor_endpoint" else ""
            return f"rl:{self.name}:actor:{where}{actor}"
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
        if not rules or ctx.recheck:  # a held call, approved: it counted when it was held
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
