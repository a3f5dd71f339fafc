"""The decision's shortcuts change nothing Cedar decides: the split of a target's policies
into those answered once per caller and those evaluated per call (policies.cedar.plan), the
pruning of the context to what the policies read, the decisions kept by request, and the
engine called directly (policies.cedar.decide.authorize). Each is checked against cedarpy's
public `is_authorized` over the whole policy set with the whole, unpruned request."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import cedarpy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from policies.cedar import Call, Caller, Policies, parse
from policies.cedar import validate as validate_policies
from policies.cedar.decide import DEFAULT_ERROR, authorize
from policies.cedar.load import policy_set_json
from policies.cedar.plan import combine, reads_of
from policies.cedar.values import cedar_input
from tests.policies.cedar.helpers import NOON_MONDAY
from tests.policies.cedar.test_listing import CATALOG, callers, calls, policy_texts

ZONES = st.sampled_from(["", "office", "vpn"])


def whole(policies: Policies, caller: Caller, call: Call, now: dt.datetime,
          modes: tuple[str, ...]) -> tuple[bool, tuple[str, ...], tuple[str, ...]]:
    """Cedar's own answer: every policy of `modes`, the full context, every argument."""
    forms = {p.id: p.est for p in policies.policies if p.mode in modes}
    kind = "Tool"
    uid = f"{call.endpoint}/{call.name}"
    schema = CATALOG.inputs.get(CATALOG.input_of.get((kind, uid), ""))
    context = {"hour": now.hour, "weekday": now.isoweekday(), "zone": call.zone,
               "era": call.era, "input": cedar_input(call.arguments, schema)}
    target = CATALOG.get(kind, uid)
    assert target is not None
    entities = json.loads(f"[{policies.caller_json(caller)},"
                          f"{json.dumps(_target_entity(target))},"
                          f'{{"uid": {{"type": "Tollhouse::Endpoint", "id": "{call.endpoint}"}},'
                          f' "attrs": {{}}, "parents": []}}]')
    request = {"principal": {"type": "Tollhouse::Caller", "id": caller.id},
               "action": {"type": "Tollhouse::Action", "id": call.method},
               "resource": {"type": "Tollhouse::Tool", "id": uid}, "context": context}
    if not forms:
        return False, (), ()
    result = cedarpy.is_authorized(
        request, cedarpy.PolicySet.from_json_str(policy_set_json(forms)), entities)
    return (result.allowed, tuple(sorted(result.diagnostics.reasons)),
            tuple(result.diagnostics.errors))


def _target_entity(target: Any) -> dict[str, Any]:
    attrs: dict[str, Any] = {"endpoint": target.endpoint, "name": target.name}
    attrs.update({k: v for k, v in target.annotations.items() if isinstance(v, bool)})
    return {"uid": {"type": "Tollhouse::Tool", "id": target.uid}, "attrs": attrs,
            "parents": [{"type": "Tollhouse::Endpoint", "id": target.endpoint}]}


def applied(raw: tuple[bool, tuple[str, ...], tuple[str, ...]]) -> tuple[bool, tuple[str, ...]]:
    allowed, reasons, errors = raw
    return allowed and not errors, reasons


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(policy_texts(), st.sampled_from(["enforce", "shadow"])),
                min_size=1, max_size=6),
       st.lists(st.tuples(callers, calls, st.integers(0, 23), ZONES), min_size=1, max_size=8))
def test_the_decision_is_cedars_over_the_whole_request(
        texts: list[tuple[str, str]], cases: list[tuple[Caller, Call, int, str]]) -> None:
    parsed = [p for n, (text, mode) in enumerate(texts)
              for p in parse(text, f"gen{n}.cedar", mode)]  # type: ignore[arg-type]
    validate_policies(parsed, CATALOG)
    policies = Policies(parsed, CATALOG)
    # each case twice: the second answer may come from what the first one kept
    for who, what, hour, zone in cases + cases:
        what = Call(what.method, what.endpoint, what.name, what.arguments, zone=zone)
        now = NOON_MONDAY.replace(hour=hour)
        decision = policies.decide(who, what, now)
        enforce = whole(policies, who, what, now, ("enforce",))
        if any(p.mode == "enforce" for p in parsed):
            assert (decision.allowed, decision.policies) == applied(enforce), (texts, who, what)
            assert bool(decision.errors) == bool(enforce[2])
        else:
            assert decision.allowed and decision.policies == ()
        if any(p.mode == "shadow" for p in parsed):
            every = whole(policies, who, what, now, ("enforce", "shadow"))
            assert decision.shadow is not None
            assert (decision.shadow.allowed, decision.shadow.policies) == applied(every)
        else:
            assert decision.shadow is None


def test_the_engine_called_directly_answers_as_is_authorized() -> None:
    text = ('permit(principal, action, resource) when { context.n > 1 };\n'
            'forbid(principal, action, resource) when { context.s == "x" };\n'
            'permit(principal, action, resource) when { context.missing == 1 };')
    forms = {p.id: p.est for p in parse(text, "d.cedar")}
    policy_set = cedarpy.PolicySet.from_json_str(policy_set_json(forms))
    entities = cedarpy.Entities.from_json_str("[]")
    for context in ({"n": 2, "s": "y"}, {"n": 2, "s": "x"}, {"n": 0, "s": "y"}, {"n": 2}):
        request = {"principal": {"type": "P", "id": "a"}, "action": {"type": "A", "id": "b"},
                   "resource": {"type": "R", "id": "c"}, "context": json.dumps(context)}
        public = cedarpy.is_authorized(request, policy_set, entities)
        direct = authorize(request, policy_set, entities)
        assert (direct["decision"] == "Allow") == public.allowed
        assert sorted(direct["diagnostics"]["reason"]) == sorted(public.diagnostics.reasons)
        assert [str(e) for e in direct["diagnostics"]["errors"]] == [
            str(e) for e in public.diagnostics.errors]
    assert any(public.diagnostics.errors for _ in [0])  # the last context lacks "s": an error


def test_combine_is_cedar_over_the_union() -> None:
    allow_a, deny_b, none = (True, ("a",), ()), (False, ("b",), ()), (False, (), ())
    assert combine(allow_a, none) == (True, ("a",), ())
    assert combine(allow_a, deny_b) == (False, ("b",), ())
    assert combine(none, none) == (False, (), ())
    assert combine((True, ("c",), ("e1",)), (True, ("a",), ())) == (True, ("a", "c"), ("e1",))
    assert combine((False, ("f",), ()), (False, ("b",), ())) == (False, ("b", "f"), ())


def test_what_a_policy_reads() -> None:
    def reads(text: str) -> Any:
        return reads_of(parse(text, "r.cedar")[0].est.get("conditions", []))
    plain = reads('permit(principal, action, resource) when { context.hour < 3 };')
    assert plain.context == {"hour"} and plain.input == frozenset()
    args = reads('permit(principal, action, resource) when { context.input has x && '
                 'context.input.x == 1 && context.zone == "a" };')
    assert args.context == {"input", "zone"} and args.input == {"x"}
    whole_input = reads('permit(principal, action, resource) when { context.input == {} };')
    assert whole_input.input is None and "input" in (whole_input.context or ())
    everything = reads('permit(principal, action, resource) when { context == {} };')
    assert everything.context is None and everything.input is None


def test_an_error_in_a_policy_read_once_still_refuses() -> None:
    """A fixed policy (no argument read) whose evaluation errors denies on every call, the
    kept answer included."""
    parsed = parse('permit(principal, action, resource);\n'
                   'forbid(principal, action, resource) when { principal.claims.dept == "x" };',
                   "e.cedar")
    policies = Policies(parsed, CATALOG)
    for _ in range(2):
        decision = policies.decide(Caller("i|u1"), Call("tools/call", "a", "t1", {"s": "x"}),
                                   NOON_MONDAY)
        assert not decision.allowed and decision.reason == DEFAULT_ERROR and decision.errors
