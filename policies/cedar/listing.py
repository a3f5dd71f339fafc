"""List and call agree: a tool is listed for a caller exactly when some permit could apply to
a call of it by that caller, whatever the arguments.

`Lister` builds, once per `Policies`, a relaxed policy set from the enforce policies' JSON
form: in each permit, a `when` condition's top-level conjuncts that name `context.input` are
replaced by `true` (a condition naming it in any other way, and every `unless` naming it, is
dropped whole), and each forbid that names `context.input` is dropped. Every relaxed permit is
implied by its original and every kept forbid does not depend on the arguments, so whenever a
call is permitted, the relaxed set permits the same call with empty arguments: no permitted
call is to an unlisted tool (tests/policies/cedar/test_listing.py checks it on generated
policies). "Names context.input" is decided conservatively: any use of `context` other than
reading `.hour`, `.weekday`, `.zone` or `.era` counts.

Shadow policies never hide a tool (they never refuse); with no enforce policy every tool is
listed.
"""

from __future__ import annotations

import datetime as dt
import functools
from typing import Any

import cedarpy

from policies.cedar.decide import Call, Caller, Policies, authorize
from policies.cedar.load import policy_set_json

ANSWERS_KEPT = 16384  # listing answers kept per Lister (caller x target x context read)
_PLAIN_CONTEXT = frozenset({"hour", "weekday", "zone", "era"})
_TRUE: dict[str, Any] = {"Value": True}


def names_input(expr: Any) -> bool:
    """Whether an expression (Cedar JSON form) may read the call's arguments."""
    if isinstance(expr, dict):
        for op in (".", "has"):
            inner = expr.get(op)
            if isinstance(inner, dict) and inner.get("left") == {"Var": "context"}:
                return inner.get("attr") not in _PLAIN_CONTEXT
        if expr.get("Var") == "context":
            return True
        return any(names_input(v) for v in expr.values())
    if isinstance(expr, list):
        return any(names_input(v) for v in expr)
    return False


def _conjuncts(expr: dict[str, Any]) -> list[dict[str, Any]]:
    both = expr.get("&&")
    if isinstance(both, dict) and set(expr) == {"&&"}:
        return _conjuncts(both["left"]) + _conjuncts(both["right"])
    return [expr]


def _and(parts: list[dict[str, Any]]) -> dict[str, Any]:
    out = parts[0]
    for part in parts[1:]:
        out = {"&&": {"left": out, "right": part}}
    return out


def relax(est: dict[str, Any]) -> dict[str, Any] | None:
    """The relaxed form of one policy: None when it is dropped."""
    if not names_input(est.get("conditions", [])):
        return est
    if est["effect"] == "forbid":
        return None
    conditions = []
    for condition in est.get("conditions", []):
        body = condition["body"]
        if not names_input(body):
            conditions.append(condition)
        elif condition["kind"] == "when":
            kept = [c if not names_input(c) else _TRUE for c in _conjuncts(body)]
            conditions.append({"kind": "when", "body": _and(kept)})
    return {**est, "conditions": conditions}


class Lister:
    """`could_permit` over one `Policies`: the relaxed set built once."""

    def __init__(self, policies: Policies) -> None:
        self.policies = policies
        relaxed = {p.id: r for p in policies.policies
                   if p.mode == "enforce" and (r := relax(p.est)) is not None}
        self.relaxed = cedarpy.PolicySet.from_json_str(policy_set_json(relaxed)) if (
            policies.enforce is not None) else None
        # answers by request: a caller listing again (same target, same context read) is
        # answered without Cedar
        self._answers: dict[tuple[str, str, str, str], bool] = {}

    def could_permit(self, caller: Caller, method: str, endpoint: str, name: str, *,
                     zone: str = "", era: str = "", now: dt.datetime | None = None) -> bool:
        """Whether some call of `name` by `caller` could be permitted, whatever the
        arguments; an evaluation error lists the tool (its call is then refused, fail closed,
        with the error named)."""
        if self.relaxed is None:
            return True
        call = Call(method, endpoint, name, zone=zone, era=era)
        relaxed, _ = self.policies.partition(call, relaxed=relax)
        if relaxed is None:
            return False
        request, entities = self.policies.request(caller, call, now, arguments=False)
        key = (self.policies.caller_json(caller), method, request["resource"]["id"],
               request["context"])
        found = self._answers.get(key)
        if found is None:
            result = authorize(request, relaxed, entities)
            found = result.get("decision") == "Allow" or bool(
                (result.get("diagnostics") or {}).get("errors"))
            if len(self._answers) >= ANSWERS_KEPT:
                self._answers.clear()
            self._answers[key] = found
        return found


@functools.lru_cache(maxsize=8)
def lister(policies: Policies) -> Lister:
    """The Lister of a Policies, built once (Policies hash by identity)."""
    return Lister(policies)


def could_permit(policies: Policies, caller: Caller, method: str, endpoint: str, name: str, *,
                 zone: str = "", era: str = "", now: dt.datetime | None = None) -> bool:
    """True exactly when some permit could apply to a call of `name` (a tool, a prompt, a
    resource URI, per `method`) on `endpoint` by `caller`, whatever the arguments."""
    return lister(policies).could_permit(caller, method, endpoint, name, zone=zone, era=era,
                                         now=now)
