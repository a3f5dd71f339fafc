"""The Cedar decision table: conditions on arguments (strings, numbers, nested objects, sets),
claims, groups, person attributes, tool annotations, time and zone; shadow beside enforce; an
evaluation error refuses."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from policies.cedar import DEFAULT_ERROR, DEFAULT_NO_PERMIT, Call, Caller, Catalog, Policies
from tests.policies.cedar.helpers import NOON_MONDAY, alice, call, catalog, compiled

CALL = 'action == Tollhouse::Action::"tools/call"'
TRANSFER = f'{CALL}, resource == Tollhouse::Tool::"pay/transfer"'
OK = {"amount": 10, "to": "bob"}

TABLE: list[tuple[str, str, Caller, Call, bool]] = [
    # strings
    ("string ==", f'permit(principal, {TRANSFER}) when {{ context.input.to == "bob" }};',
     alice(), call("transfer", **OK), True),
    ("string !=", f'permit(principal, {TRANSFER}) when {{ context.input.to == "bob" }};',
     alice(), call("transfer", amount=1, to="eve"), False),
    ("string like", (f'permit(principal, {CALL}, resource == Tollhouse::Tool::"github/create_issue")'
     ' when { context.input.repo like "acme/*" };'),
     alice(), call("create_issue", "github", repo="acme/infra"), True),
    ("string like, other org",
     (f'permit(principal, {CALL}, resource == Tollhouse::Tool::"github/create_issue")'
     ' when { context.input.repo like "acme/*" };'),
     alice(), call("create_issue", "github", repo="evil/infra"), False),
    # numbers: number -> decimal, integer -> Long
    ("decimal under", (f'permit(principal, {TRANSFER}) when '
     '{ context.input.amount.lessThan(decimal("500.0")) };'), alice(), call("transfer", **OK), True),
    ("decimal over", (f'permit(principal, {TRANSFER}) when '
     '{ context.input.amount.lessThan(decimal("500.0")) };'),
     alice(), call("transfer", amount=500.5, to="b"), False),
    ("long", (f'permit(principal, {TRANSFER}) when '
     '{ context.input has count && context.input.count <= 3 };'),
     alice(), call("transfer", amount=1, to="b", count=3), True),
    ("long over", (f'permit(principal, {TRANSFER}) when '
     '{ context.input has count && context.input.count <= 3 };'),
     alice(), call("transfer", amount=1, to="b", count=4), False),
    # nested objects and sets
    ("nested record", (f'permit(principal, {TRANSFER}) when {{ context.input has meta && '
     'context.input.meta has origin && context.input.meta.origin has country && '
     'context.input.meta.origin.country == "NL" };'),
     alice(), call("transfer", amount=1, to="b", meta={"origin": {"country": "NL"}}), True),
    ("set contains: forbid wins", (f'permit(principal, {TRANSFER});\n'
     f'forbid(principal, {TRANSFER}) when {{ context.input has meta && context.input.meta has '
     'tags && context.input.meta.tags.contains("blocked") };'),
     alice(), call("transfer", amount=1, to="b", meta={"tags": ["x", "blocked"]}), False),
    ("set without it", (f'permit(principal, {TRANSFER});\n'
     f'forbid(principal, {TRANSFER}) when {{ context.input has meta && context.input.meta has '
     'tags && context.input.meta.tags.contains("blocked") };'),
     alice(), call("transfer", amount=1, to="b", meta={"tags": ["x"]}), True),
    # claims, groups, person attributes, client
    ("claim", (f'permit(principal, {CALL}, resource) when {{ principal.claims has department && '
     'principal.claims.department == "finance" };'),
     alice(claims={"department": "finance"}), call("balance"), True),
    ("claim missing", (f'permit(principal, {CALL}, resource) when {{ principal.claims has '
     'department && principal.claims.department == "finance" };'), alice(), call("balance"), False),
    ("group", f'permit(principal, {CALL}, resource) when {{ principal.groups.contains("sre") }};',
     alice(groups=frozenset({"sre"})), call("balance"), True),
    ("no group", f'permit(principal, {CALL}, resource) when {{ principal.groups.contains("sre") }};',
     alice(groups=frozenset({"dev"})), call("balance"), False),
    ("person attribute", (f'permit(principal, {CALL}, resource) when {{ principal.attributes has '
     'team && principal.attributes.team == "payments" };'),
     alice(attributes={"team": "payments"}), call("balance"), True),
    ("api key principal", f'permit(principal == Tollhouse::Caller::"key|k1", {CALL}, resource);',
     Caller.key("k1"), call("balance"), True),
    # an agent acting for a person (RFC 8693 `act`): the person is the principal, the agent
    # its actor; a policy may let the person in but not an agent acting for them
    ("person, no actor", (f'permit(principal, {CALL}, resource) when {{ principal.actor == "" }};'),
     alice(), call("balance"), True),
    ("agent for a person", (f'permit(principal, {CALL}, resource) when '
     '{ principal.actor == "" };'), alice(actor="client:agent"), call("balance"), False),
    ("named agent", (f'permit(principal == Tollhouse::Caller::"https://idp.example|alice", '
     f'{CALL}, resource) when {{ principal.actor == "client:agent" }};'),
     alice(actor="client:agent"), call("balance"), True),
    # annotations, endpoint
    ("read-only tools", (f'permit(principal, {CALL}, resource) when {{ resource has readOnlyHint '
     '&& resource.readOnlyHint };'), alice(), call("balance"), True),
    ("not read-only", (f'permit(principal, {CALL}, resource) when {{ resource has readOnlyHint '
     '&& resource.readOnlyHint };'), alice(), call("transfer", **OK), False),
    ("endpoint", f'permit(principal, {CALL}, resource in Tollhouse::Endpoint::"github");',
     alice(), call("create_issue", "github", repo="a/b"), True),
    ("other endpoint", f'permit(principal, {CALL}, resource in Tollhouse::Endpoint::"github");',
     alice(), call("balance"), False),
    # time (UTC) and zone
    ("office hours", (f'permit(principal, {CALL}, resource) when {{ context.hour >= 9 && '
     'context.hour < 18 && context.weekday <= 5 };'), alice(), call("balance"), True),
    ("zone", f'permit(principal, {CALL}, resource) when {{ context.zone == "internal" }};',
     alice(), Call("tools/call", "pay", "balance", {}, zone="internal"), True),
    ("wrong zone", f'permit(principal, {CALL}, resource) when {{ context.zone == "internal" }};',
     alice(), Call("tools/call", "pay", "balance", {}, zone="remote"), False),
    # prompts
    ("prompt argument", ('permit(principal, action == Tollhouse::Action::"prompts/get", resource)'
     ' when { context.input.repo like "acme/*" };'), alice(),
     Call("prompts/get", "github", "summary", {"repo": "acme/x"}), True),
]


@pytest.mark.parametrize(("text", "who", "what", "allowed"),
                         [row[1:] for row in TABLE], ids=[row[0] for row in TABLE])
def test_decision_table(text: str, who: Caller, what: Call, allowed: bool) -> None:
    decision = compiled(text).decide(who, what, NOON_MONDAY)
    assert decision.allowed is allowed, decision
    assert decision.errors == ()


def test_weekend_and_night_refused() -> None:
    p = compiled(f'permit(principal, {CALL}, resource) when {{ context.hour >= 9 && '
                 'context.weekday <= 5 };')
    saturday = dt.datetime(2026, 1, 10, 12, tzinfo=dt.UTC)
    assert not p.decide(alice(), call("balance"), saturday).allowed
    assert not p.decide(alice(), call("balance"), NOON_MONDAY.replace(hour=3)).allowed


def test_deciding_policies_and_reason() -> None:
    p = compiled(f'@id("all") permit(principal, {CALL}, resource);\n'
                 f'@id("big") @reason("transfers over 500 need approval") forbid(principal, '
                 f'{TRANSFER}) when {{ context.input.amount.greaterThan(decimal("500.0")) }};\n'
                 f'forbid(principal, {TRANSFER}) when {{ context.input.to == "eve" }};')
    allowed = p.decide(alice(), call("transfer", **OK), NOON_MONDAY)
    assert (allowed.allowed, allowed.policies, allowed.reason) == (True, ("all",), "")
    big = p.decide(alice(), call("transfer", amount=900, to="bob"), NOON_MONDAY)
    assert (big.allowed, big.policies, big.reason) == (
        False, ("big",), "transfers over 500 need approval")
    eve = p.decide(alice(), call("transfer", amount=1, to="eve"), NOON_MONDAY)
    assert (eve.policies, eve.reason) == (("t.cedar:3",), "refused by policy")
    assert "900" not in big.reason


def test_no_permit_is_a_denial_with_the_default_text() -> None:
    p = compiled(f'permit(principal, {CALL}, resource in Tollhouse::Endpoint::"github");')
    decision = p.decide(alice(), call("balance"), NOON_MONDAY)
    assert (decision.allowed, decision.policies, decision.reason) == (
        False, (), DEFAULT_NO_PERMIT)


def test_no_policies_decide_nothing() -> None:
    p = Policies([], catalog())
    assert p.empty and p.decide(alice(), call("transfer", **OK)).allowed


@pytest.mark.parametrize(("arguments", "named"), [
    ({"to": "bob"}, "amount"),  # a required argument missing
    ({"amount": "ten", "to": "bob"}, "t.cedar:2"),  # of the wrong type: the forbid errs
    ({"amount": 1.000001, "to": "bob"}, "input.amount"),  # beyond decimal's four digits
    ({"amount": 1, "to": "bob", "count": 2**70}, "input.count"),  # beyond Long
])
def test_an_evaluation_error_refuses(arguments: dict[str, Any], named: str) -> None:
    p = compiled(f'permit(principal, {CALL}, resource);\n'
                 f'forbid(principal, {TRANSFER}) when '
                 '{ context.input.amount.greaterThan(decimal("500.0")) || '
                 '(context.input has count && context.input.count > 5) };')
    decision = p.decide(alice(), call("transfer", **arguments), NOON_MONDAY)
    assert not decision.allowed
    assert decision.reason == DEFAULT_ERROR
    assert any(named in e for e in decision.errors), decision.errors


def test_an_argument_no_policy_reads_is_neither_converted_nor_sent() -> None:
    """Only what the policies reaching the tool can read goes into the request: an argument
    none of them names cannot change a decision, so one Cedar could not hold refuses
    nothing (and costs no parsing)."""
    p = compiled(f'permit(principal, {CALL}, resource);\n'
                 f'forbid(principal, {TRANSFER}) when '
                 '{ context.input.amount.greaterThan(decimal("500.0")) };')
    unread = {"amount": 1, "to": "bob", "count": 2**70, "note": 1.000001}
    assert p.decide(alice(), call("transfer", **unread), NOON_MONDAY).allowed
    request, _ = p.request(alice(), call("transfer", **unread), NOON_MONDAY)
    assert '"count"' not in request["context"] and '"to"' not in request["context"]


def test_a_tool_not_in_the_catalog_is_decided_on_its_arguments_as_sent() -> None:
    p = Policies(compiled(f'permit(principal, {CALL}, resource);').policies, Catalog())
    assert p.decide(alice(), call("unknown", x=1.5), NOON_MONDAY).allowed


SHADOW_FORBID = (f'@id("cap") @mode("shadow") @reason("cap") forbid(principal, {TRANSFER}) when '
                 '{ context.input.amount.greaterThan(decimal("100.0")) };')


def test_a_shadow_policy_reports_and_never_refuses() -> None:
    p = compiled(f'@id("all") permit(principal, {CALL}, resource);\n{SHADOW_FORBID}')
    decision = p.decide(alice(), call("transfer", amount=200, to="b"), NOON_MONDAY)
    assert decision.allowed and decision.policies == ("all",)
    assert decision.shadow is not None and not decision.shadow.allowed
    assert decision.shadow.policies == ("cap",) and decision.shadow.reason == "cap"
    assert decision.shadow_denied
    small = p.decide(alice(), call("transfer", amount=20, to="b"), NOON_MONDAY)
    assert small.allowed and small.shadow is not None and small.shadow.allowed
    assert not small.shadow_denied


def test_an_enforced_denial_stands_beside_the_shadow_one() -> None:
    p = compiled(f'permit(principal, {CALL}, resource) when {{ context.input has count }};\n'
                 + SHADOW_FORBID)
    decision = p.decide(alice(), call("transfer", amount=200, to="b"), NOON_MONDAY)
    assert not decision.allowed and decision.reason == DEFAULT_NO_PERMIT
    assert not decision.shadow_denied  # nothing let through that shadow would have refused


def test_shadow_mode_makes_every_policy_shadow() -> None:
    p = compiled(f'permit(principal, {CALL}, resource in Tollhouse::Endpoint::"github");',
                 mode="shadow")
    decision = p.decide(alice(), call("balance"), NOON_MONDAY)
    assert decision.allowed and decision.shadow_denied
    assert decision.shadow is not None and decision.shadow.reason == DEFAULT_NO_PERMIT


def test_a_shadow_error_does_not_refuse() -> None:
    p = compiled(f'permit(principal, {CALL}, resource);\n{SHADOW_FORBID}')
    decision = p.decide(alice(), call("transfer", to="b"), NOON_MONDAY)
    # the enforce policies never read `amount`: allowed; the shadow one errors: reported
    assert decision.allowed
    assert decision.shadow is not None and decision.shadow.errors and decision.shadow_denied
