"""List and call agree: a tool is listed exactly when some permit could apply to a call of it
by that caller whatever the arguments, so no permitted call is to an unlisted tool (a property
over generated policies, callers and calls)."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from policies.cedar import Call, Caller, Catalog, Lister, Policies, Target, could_permit, parse
from policies.cedar import validate as validate_policies
from policies.cedar.listing import names_input, relax
from tests.policies.cedar.helpers import NOON_MONDAY, alice, call, compiled

CALL = 'action == Tollhouse::Action::"tools/call"'


def test_a_tool_whose_permit_depends_on_arguments_is_listed() -> None:
    p = compiled(f'permit(principal, {CALL}, resource == Tollhouse::Tool::"pay/transfer") when '
                 '{ context.input.amount.lessThan(decimal("5.0")) };')
    assert could_permit(p, alice(), "tools/call", "pay", "transfer", now=NOON_MONDAY)
    assert not could_permit(p, alice(), "tools/call", "pay", "balance", now=NOON_MONDAY)


def test_a_forbid_on_arguments_never_hides_and_one_without_does() -> None:
    p = compiled(f'permit(principal, {CALL}, resource);\n'
                 f'forbid(principal, {CALL}, resource == Tollhouse::Tool::"pay/transfer") when '
                 '{ context.input.to == "eve" };\n'
                 f'forbid(principal, {CALL}, resource == Tollhouse::Tool::"pay/balance") unless '
                 '{ principal.groups.contains("finance") };')
    assert could_permit(p, alice(), "tools/call", "pay", "transfer", now=NOON_MONDAY)
    assert not could_permit(p, alice(), "tools/call", "pay", "balance", now=NOON_MONDAY)
    finance = alice(groups=frozenset({"finance"}))
    assert could_permit(p, finance, "tools/call", "pay", "balance", now=NOON_MONDAY)


def test_the_caller_decides_the_listing() -> None:
    p = compiled(f'permit(principal, {CALL}, resource) when {{ principal.groups.contains("sre") '
                 '&& context.input has repo && context.input.repo like "acme/*" };')
    sre = alice(groups=frozenset({"sre"}))
    assert could_permit(p, sre, "tools/call", "github", "create_issue", now=NOON_MONDAY)
    assert not could_permit(p, alice(), "tools/call", "github", "create_issue", now=NOON_MONDAY)


def test_shadow_policies_and_no_policies_hide_nothing() -> None:
    p = compiled(f'permit(principal, {CALL}, resource in Tollhouse::Endpoint::"github");',
                 mode="shadow")
    assert could_permit(p, alice(), "tools/call", "pay", "balance")
    assert Lister(Policies([], Catalog())).could_permit(alice(), "tools/call", "a", "b")


def test_names_input_is_conservative() -> None:
    est = parse(f'permit(principal, {CALL}, resource) when {{ context.hour < 3 && '
                'context["input"] has x } unless { context.zone == "x" };', "p")[0].est
    when, unless = est["conditions"]
    assert names_input(when["body"]) and not names_input(unless["body"])
    relaxed = relax(est)
    assert relaxed is not None and not names_input(relaxed["conditions"])
    assert len(relaxed["conditions"]) == 2


# -- the property -----------------------------------------------------------------------------

TOOLS = [
    Target.tool("a", {"name": "t1", "inputSchema": {"type": "object", "properties": {
        "s": {"type": "string"}, "n": {"type": "integer"}}}}),
    Target.tool("a", {"name": "t2", "inputSchema": {"type": "object", "properties": {
        "s": {"type": "string"}}}}),
    Target.tool("b", {"name": "t3", "annotations": {"readOnlyHint": True}}),
]
CATALOG = Catalog(TOOLS, claims=["dept"])
WORDS = ["x", "y", "z"]
GROUPS = ["g1", "g2"]

atoms = st.one_of(
    st.sampled_from(WORDS).map(lambda v: f'(context.input has s && context.input.s == "{v}")'),
    st.integers(0, 4).map(lambda k: f"(context.input has n && context.input.n > {k})"),
    st.sampled_from(GROUPS).map(lambda g: f'principal.groups.contains("{g}")'),
    st.sampled_from(WORDS).map(
        lambda v: f'(principal.claims has dept && principal.claims.dept == "{v}")'),
    st.integers(0, 23).map(lambda h: f"context.hour < {h}"),
    st.just("(resource has readOnlyHint && resource.readOnlyHint)"),
)
expressions = st.recursive(atoms, lambda inner: st.one_of(
    inner.map(lambda e: f"!({e})"),
    st.tuples(inner, inner).map(lambda p: f"({p[0]} || {p[1]})"),
    st.tuples(inner, inner).map(lambda p: f"({p[0]} && {p[1]})"),
), max_leaves=4)
scopes = st.sampled_from([
    "resource", 'resource == Tollhouse::Tool::"a/t1"', 'resource == Tollhouse::Tool::"a/t2"',
    'resource in Tollhouse::Endpoint::"a"', 'resource in Tollhouse::Endpoint::"b"',
    "resource is Tollhouse::Tool"])
principals = st.sampled_from(["principal", 'principal == Tollhouse::Caller::"i|u1"'])
conditions = st.lists(st.tuples(st.sampled_from(["when", "unless"]), expressions), max_size=2)


@st.composite
def policy_texts(draw: Any) -> str:
    effect = draw(st.sampled_from(["permit", "permit", "forbid"]))
    body = " ".join(f"{kind} {{ {expr} }}" for kind, expr in draw(conditions))
    return f"{effect}({draw(principals)}, {CALL}, {draw(scopes)}) {body};"


callers = st.builds(
    lambda who, groups, dept: Caller(who, frozenset(groups),
                                     {"dept": dept} if dept else {}),
    st.sampled_from(["i|u1", "i|u2"]), st.sets(st.sampled_from(GROUPS)),
    st.one_of(st.none(), st.sampled_from(WORDS)))
arguments = st.fixed_dictionaries({}, optional={
    "s": st.sampled_from(WORDS), "n": st.integers(-1, 6)})
calls = st.builds(lambda target, args: Call("tools/call", target.endpoint, target.name, args),
                  st.sampled_from(TOOLS), arguments)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(policy_texts(), min_size=1, max_size=5), st.lists(
    st.tuples(callers, calls), min_size=1, max_size=6), st.integers(0, 23))
def test_no_permitted_call_is_to_an_unlisted_tool(texts: list[str],
                                                  cases: list[tuple[Caller, Call]],
                                                  hour: int) -> None:
    parsed = parse("\n".join(texts), "gen.cedar")
    validate_policies(parsed, CATALOG)  # every generated policy is a valid one
    policies = Policies(parsed, CATALOG)
    lister = Lister(policies)
    now = NOON_MONDAY.replace(hour=hour)
    for who, what in cases:
        if policies.decide(who, what, now).allowed:
            assert lister.could_permit(who, what.method, what.endpoint, what.name, now=now), (
                texts, who, what)


def test_the_listing_is_not_everything() -> None:
    """The relaxation keeps what does not depend on the arguments: groups hide tools."""
    p = Policies(parse(f'permit(principal, {CALL}, resource) when '
                       '{ principal.groups.contains("g1") && context.input has s };', "p"),
                 CATALOG)
    assert not could_permit(p, Caller("i|u1"), "tools/call", "a", "t1")
    assert could_permit(p, Caller("i|u1", frozenset({"g1"})), "tools/call", "a", "t1")
    assert p.decide(Caller("i|u1", frozenset({"g1"})), call("t1", "a", s="x")).allowed
