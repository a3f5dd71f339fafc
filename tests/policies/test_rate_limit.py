import asyncio

import orjson
import pytest

from policies.rate_limit import RateLimit, RateLimitRule, parse_rate, validate_rules
from proxy.auth.principal import Principal
from proxy.chain import CallContext, Chain
from proxy.errors import RateLimited, render
from proxy.jsonrpc import McpMessage
from proxy.state.ratelimit import MemoryRateLimitStore
from tests.builders import answer, context, message, principal
from tests.helpers import Clock

ALICE = principal("alice", "https://idp")
BOB = principal("bob", "https://idp")


def make_call(method: str = "tools/call", tool: str | None = "t") -> McpMessage:
    return message(method, **({} if tool is None else {"name": tool}))


def make_ctx(caller: Principal = ALICE, endpoint: str = "e",
             api_key_id: str | None = None) -> CallContext:
    return context(caller, endpoint, api_key_id=api_key_id)


def make_policy(*rules: RateLimitRule, clock: Clock | None = None) -> RateLimit:
    return RateLimit(list(rules), MemoryRateLimitStore(clock=clock or Clock()))


async def passes(policy: RateLimit, call: McpMessage | None = None,
                 ctx: CallContext | None = None) -> bool:
    try:
        await policy.check(call or make_call(), ctx or make_ctx())
    except RateLimited:
        return False
    return True


async def count_passing(policy: RateLimit, n: int, call: McpMessage | None = None,
                        ctx: CallContext | None = None) -> int:
    return sum([await passes(policy, call, ctx) for _ in range(n)])


async def test_a_burst_then_a_429_with_the_rule_and_retry_after() -> None:
    policy = make_policy(RateLimitRule("calls-per-user", rate="10/s", burst=20))
    assert await count_passing(policy, 20) == 20
    with pytest.raises(RateLimited) as info:
        await policy.check(make_call(), make_ctx())
    exc = info.value
    assert exc.reason == exc.audit_reason == "rate_limit: calls-per-user"
    assert exc.retry_after_s == pytest.approx(0.1)
    status, headers, body = render(exc, request_id=1)
    assert (status, headers["Retry-After"]) == (429, "1")
    assert orjson.loads(body)["error"] == {"code": -32000, "message": "Too many requests"}


async def test_tokens_come_back_over_time() -> None:
    clock = Clock()
    policy = make_policy(RateLimitRule("r", rate="10/s", burst=20), clock=clock)
    assert await count_passing(policy, 30) == 20
    clock.advance(0.1)
    assert await count_passing(policy, 5) == 1
    clock.advance(0.35)
    assert await count_passing(policy, 5) == 3
    clock.advance(60)
    assert await count_passing(policy, 30) == 20  # refilled to the burst, not beyond


@pytest.mark.parametrize(("rate", "burst", "passing", "retry_after"), [
    ("5/min", 0, 5, 12.0),      # burst 0: the rate's count
    ("100/h", 0, 100, 36.0),
    ("2/s", 1, 1, 0.5),         # burst 1: evenly spaced
    ("1/h", 3, 3, 3600.0),
])
async def test_burst_and_retry_after(rate: str, burst: int, passing: int,
                                     retry_after: float) -> None:
    policy = make_policy(RateLimitRule("r", rate=rate, burst=burst))
    assert await count_passing(policy, passing + 10) == passing
    with pytest.raises(RateLimited) as info:
        await policy.check(make_call(), make_ctx())
    assert info.value.retry_after_s == pytest.approx(retry_after)


@pytest.mark.parametrize(("key", "first", "second", "shared"), [
    ("principal", make_ctx(ALICE, "e"), make_ctx(ALICE, "f"), True),
    ("principal", make_ctx(ALICE), make_ctx(BOB), False),
    ("principal_endpoint", make_ctx(ALICE, "e"), make_ctx(ALICE, "f"), False),
    ("principal_endpoint", make_ctx(ALICE, "e"), make_ctx(BOB, "e"), False),
    ("principal_endpoint", make_ctx(ALICE, "e", "k1"), make_ctx(ALICE, "e", "k2"), True),
    ("endpoint", make_ctx(ALICE, "e"), make_ctx(BOB, "e"), True),
    ("endpoint", make_ctx(ALICE, "e"), make_ctx(ALICE, "f"), False),
    ("api_key", make_ctx(ALICE, "e", "k1"), make_ctx(BOB, "f", "k1"), True),
    ("api_key", make_ctx(ALICE, "e", "k1"), make_ctx(ALICE, "e", "k2"), False),
])
async def test_each_key_kind_isolates_the_right_callers(
        key: str, first: CallContext, second: CallContext, shared: bool) -> None:
    policy = make_policy(RateLimitRule("r", key=key, rate="1/h", burst=1))
    assert await passes(policy, ctx=first)
    assert await passes(policy, ctx=second) is not shared


@pytest.mark.parametrize(("first", "second", "shared"), [
    (make_call(tool="a"), make_call(tool="a"), True),
    (make_call(tool="a"), make_call(tool="b"), False),
])
async def test_principal_tool_keys_on_the_tool(first: McpMessage, second: McpMessage,
                                               shared: bool) -> None:
    policy = make_policy(RateLimitRule("r", key="principal_tool", rate="1/h", burst=1))
    assert await passes(policy, first, make_ctx(ALICE, "e"))
    assert await passes(policy, second, make_ctx(ALICE, "f")) is not shared
    assert await passes(policy, second, make_ctx(BOB, "e"))


async def test_crafted_names_cannot_share_a_bucket() -> None:
    policy = make_policy(RateLimitRule("r", key="principal_tool", rate="1/h", burst=1))
    assert await passes(policy, make_call(tool="a:x"), make_ctx(principal("s")))
    assert await passes(policy, make_call(tool="a"), make_ctx(principal("s", "x:i")))


@pytest.mark.parametrize(("key", "call", "ctx"), [
    ("principal_tool", make_call("tools/list", tool=None), make_ctx()),
    ("principal_tool", make_call(tool=None), make_ctx()),  # a tools/call with no name
    ("api_key", make_call(), make_ctx(api_key_id=None)),
])
async def test_a_rule_whose_key_the_call_lacks_does_not_apply(
        key: str, call: McpMessage, ctx: CallContext) -> None:
    policy = make_policy(RateLimitRule("r", key=key, methods=["tools/call", "tools/list"],
                                       rate="1/h", burst=1))
    assert await count_passing(policy, 5, call, ctx) == 5


@pytest.mark.parametrize(("methods", "method", "limited"), [
    (["tools/call"], "tools/call", True),
    (["tools/call"], "tools/list", False),
    (["tools/list", "notifications/initialized"], "notifications/initialized", True),
    (["tools/list", "tools/list"], "tools/list", True),  # listed twice, charged once
])
async def test_rules_match_methods(methods: list[str], method: str, limited: bool) -> None:
    policy = make_policy(RateLimitRule("r", methods=methods, rate="1/h", burst=2))
    assert await count_passing(policy, 3, make_call(method)) == (2 if limited else 3)


async def test_responses_are_never_limited() -> None:
    policy = make_policy(RateLimitRule("r", rate="1/h", burst=1))
    response = answer(id=7)
    assert await count_passing(policy, 3, response) == 3


async def test_endpoints_restrict_a_rule() -> None:
    policy = make_policy(RateLimitRule("r", key="endpoint", rate="1/h", burst=1,
                                       endpoints=["e", "g"]))
    assert await count_passing(policy, 3, ctx=make_ctx(endpoint="e")) == 1
    assert await count_passing(policy, 3, ctx=make_ctx(endpoint="f")) == 3
    assert await count_passing(policy, 3, ctx=make_ctx(endpoint="g")) == 1


async def test_every_matching_rule_applies_and_a_denial_charges_none() -> None:
    clock = Clock()
    policy = make_policy(RateLimitRule("per-user", rate="1/h", burst=3),
                         RateLimitRule("per-endpoint", key="endpoint", rate="1/s", burst=1),
                         clock=clock)
    assert await passes(policy)
    for _ in range(20):  # held back by per-endpoint; per-user must not be drained meanwhile
        with pytest.raises(RateLimited) as info:
            await policy.check(make_call(), make_ctx())
        assert info.value.reason == "rate_limit: per-endpoint"
    for _ in range(2):
        clock.advance(1)
        assert await passes(policy)
    clock.advance(1)
    with pytest.raises(RateLimited) as info:
        await policy.check(make_call(), make_ctx())
    assert info.value.reason == "rate_limit: per-user"
    assert info.value.retry_after_s == pytest.approx(3600 - 3)


async def test_a_looser_rule_for_protocol_chatter() -> None:
    policy = make_policy(RateLimitRule("calls", rate="1/h", burst=1),
                         RateLimitRule("chatter", methods=["tools/list", "ping"], rate="5/s"))
    assert await count_passing(policy, 3) == 1
    assert await count_passing(policy, 8, make_call("tools/list", None)) == 5


async def test_exact_under_concurrency_with_a_frozen_clock() -> None:
    policy = make_policy(RateLimitRule("r", rate="10/s", burst=100),
                         RateLimitRule("e", key="endpoint", rate="1/s", burst=500))
    results = await asyncio.gather(*(policy.check(make_call(), make_ctx()) for _ in range(1000)),
                                   return_exceptions=True)
    assert sum(r is None for r in results) == 100
    assert all(r is None or isinstance(r, RateLimited) for r in results)


async def test_exact_under_concurrency_while_time_moves() -> None:
    # 1000 calls 1 ms apart: the burst of 100 at once, then one per 100 ms for 0.9 s
    policy = make_policy(RateLimitRule("r", rate="10/s", burst=100),
                         clock=Clock(5.0, step=0.001))
    results = await asyncio.gather(*(passes(policy) for _ in range(1000)))
    assert sum(results) == 109


async def test_the_chain_passes_the_429_through() -> None:
    chain = Chain([make_policy(RateLimitRule("r", rate="1/h", burst=1))])
    await chain.run(make_call(), make_ctx())
    with pytest.raises(RateLimited):
        await chain.run(make_call(), make_ctx())


@pytest.mark.parametrize(("rate", "parsed"), [("10/s", (10, 1)), ("5/min", (5, 60)),
                                              ("1/h", (1, 3600)), ("1000000/s", (1000000, 1))])
def test_rates_parse(rate: str, parsed: tuple[int, int]) -> None:
    assert parse_rate(rate) == parsed


@pytest.mark.parametrize("rate", ["10/sec", "0/s", "-1/s", "1.5/s", "10 /s", "", "/s", "10/d",
                                  "10/m", "10", "01/s"])
def test_bad_rates_are_refused(rate: str) -> None:
    with pytest.raises(ValueError, match=r"is not n/s, n/min or n/h"):
        parse_rate(rate)


@pytest.mark.parametrize(("rules", "message"), [
    ([RateLimitRule("a", rate="10/sec")], "rate_limits[0].rate: '10/sec' is not n/s, n/min or n/h"),
    ([RateLimitRule("a"), RateLimitRule("a")], "rate_limits[1].name: 'a' repeats rate_limits[0]"),
    ([RateLimitRule("a:b")], "rate_limits[0].name: 'a:b' must be 1-64 letters"),
    ([RateLimitRule("")], "rate_limits[0].name: '' must be"),
    ([RateLimitRule("a", key="user")], "rate_limits[0].key: 'user' is not one of principal, "),
    ([RateLimitRule("a", burst=-1)], "rate_limits[0].burst: -1 must be 0"),
    ([RateLimitRule("a", methods=[])], "rate_limits[0].methods: must list at least one"),
    ([RateLimitRule("a", methods=[""])], "rate_limits[0].methods: must list"),
    ([RateLimitRule("a", key="principal_tool", methods=["tools/list"])],
     "rate_limits[0].key: 'principal_tool' needs 'tools/call' in methods"),
    ([RateLimitRule("a", rate="2000000/s")], "rate_limits[0].rate: '2000000/s' is more than"),
])
def test_validation_names_the_rule_and_field(rules: list[RateLimitRule], message: str) -> None:
    with pytest.raises(ValueError) as info:
        validate_rules(rules)
    assert str(info.value).startswith(message)
    assert "\n" not in str(info.value)
    with pytest.raises(ValueError):
        RateLimit(rules, MemoryRateLimitStore())  # the policy refuses them too


def test_endpoints_are_checked_against_known_upstreams() -> None:
    rules = [RateLimitRule("a", endpoints=["e", "typo"])]
    validate_rules(rules)
    with pytest.raises(ValueError, match=r"^rate_limits\[0\].endpoints: 'typo' is not a "):
        validate_rules(rules, known_endpoints={"e", "f"})


def test_a_task_request_has_a_tool_to_key_on() -> None:
    """A principal_tool rule may count a task's polls alone: tasks/get names its task's tool."""
    validate_rules([RateLimitRule("polls", key="principal_tool", methods=["tasks/get"])])


def test_the_defaults_validate() -> None:
    validate_rules([RateLimitRule("calls-per-user"), RateLimitRule("b", key="principal_tool")])
    assert (RateLimit.name, RateLimit.order) == ("rate_limit", 200)
