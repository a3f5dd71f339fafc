
import pytest

from policies import default_policies
from proxy.auth import ANONYMOUS
from proxy.chain import CallContext, Chain
from proxy.config import from_dict
from proxy.errors import InternalError, PolicyDenied
from proxy.jsonrpc import McpMessage
from proxy.state.ratelimit import MemoryRateLimitStore
from tests.builders import context, tool_call

CALL = tool_call()
CTX = context(ANONYMOUS)


def make_policy(name: str, order: int, log: list[str], fail: Exception | None = None) -> object:
    class P:
        pass

    async def check(self: object, call: McpMessage, ctx: CallContext) -> None:
        log.append(name)
        if fail is not None:
            raise fail

    P.name = name  # type: ignore[attr-defined]
    P.order = order  # type: ignore[attr-defined]
    P.check = check  # type: ignore[attr-defined]
    return P()


async def test_runs_in_declared_order_not_list_order() -> None:
    log: list[str] = []
    chain = Chain([make_policy("metering", 500, log), make_policy("access", 100, log),
                   make_policy("rate_limit", 200, log)])  # type: ignore[list-item]
    assert chain.names == ["access", "rate_limit", "metering"]
    await chain.run(CALL, CTX)
    assert log == ["access", "rate_limit", "metering"]


async def test_a_denial_stops_the_chain_before_later_policies() -> None:
    log: list[str] = []
    chain = Chain([make_policy("access", 100, log, PolicyDenied("access: tool t")),
                   make_policy("metering", 500, log)])  # type: ignore[list-item]
    with pytest.raises(PolicyDenied):
        await chain.run(CALL, CTX)
    assert log == ["access"]


async def test_a_broken_policy_fails_closed() -> None:
    log: list[str] = []
    chain = Chain([make_policy("buggy", 100, log, KeyError("x"))])  # type: ignore[list-item]
    with pytest.raises(InternalError) as info:
        await chain.run(CALL, CTX)
    assert info.value.wire_message == "Internal error"  # the bug is audited, not shown


def test_duplicate_orders_fail_at_start_up() -> None:
    with pytest.raises(ValueError, match="share order 100"):
        Chain([make_policy("a", 100, []), make_policy("b", 100, [])])  # type: ignore[list-item]


def test_default_policies_for_a_plain_config() -> None:
    cfg = from_dict({"upstreams": [{"name": "a", "url": "http://h/"}]})
    # screening warns by default, for the servers /api/v1 adds at run time too
    assert Chain(default_policies(cfg)).names == ["guardrails"]


def test_default_policies_in_chain_order() -> None:
    cfg = from_dict({
        "auth": {"mode": "jwt", "issuers": [{"issuer": "i", "hs256_secret": "s" * 32,
                                              "algorithms": ["HS256"]}]},
        "rate_limits": [{"name": "per-user", "rate": "5/s"}],
        "upstreams": [{"name": "a", "url": "http://h/", "access": {"tools_deny": ["x*"]}}]})
    policies = default_policies(cfg, rate_limits=MemoryRateLimitStore())
    assert Chain(policies).names == ["access", "rate_limit", "guardrails"]
    with pytest.raises(ValueError, match="no rate-limit store"):  # built at start-up, not here
        default_policies(cfg)
