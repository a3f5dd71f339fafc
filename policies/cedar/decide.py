"""Deciding one call: the Cedar request built from the caller and the call, evaluated against
the policies compiled once (`Policies`).

What is built once, when the policies or the targets change: the Cedar policy sets (the
enforce policies; all of them, for the shadow decision), each policy's `@reason`, and the JSON
of every known target's entity with its endpoint. Per call: the caller's entity (a small JSON
object, its parsed Cedar entities kept per caller and target), the context (`input`
converted from the arguments, hour, weekday, zone, era) and one Cedar evaluation (two when
shadow policies exist) over only the policies whose scope can reach the target (partitioned
once per target, on its first call: a policy whose scope cannot match is not applicable in
Cedar anyway, and no policy reaching a target decides "no permit" without calling Cedar).

How enforce and shadow combine: the decision that is applied is Cedar's over the enforce
policies only (none at all: allowed, the policy layer is absent); the shadow decision is
Cedar's over every policy (what would be decided if the shadow ones were enforced). The shadow
decision never refuses; it is reported, with the policies that decided it.

An evaluation error (an argument missing or of an unexpected type, a number Cedar cannot
hold) refuses the call: Cedar skips a policy that errors, which for a `forbid` would let the
call through, so any error denies, naming it.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import cedarpy
import orjson

from policies.cedar.load import Policy, policy_set_json, reachable
from policies.cedar.plan import NOTHING, Plan, Raw, Reads, Side, combine, plan, policy_set, reads_of
from policies.cedar.schema import ANNOTATIONS, CALL_ACTIONS, NAMESPACE, Catalog, Target
from policies.cedar.values import Unrepresentable, cedar_input

DEFAULT_FORBID = "refused by policy"
DEFAULT_NO_PERMIT = "no policy permits this call"
DEFAULT_ERROR = "policy evaluation failed"

_ACTION = f"{NAMESPACE}::Action"
_CALLER = f"{NAMESPACE}::Caller"
_ENDPOINT = f"{NAMESPACE}::Endpoint"
ENTITIES_KEPT = 4096  # parsed entity sets (one per caller and target) kept per Policies
DECIDED_CONTEXT_MAX = 512  # a decision is kept when its context's JSON is at most this long


@dataclass(frozen=True)
class Caller:
    """Who calls: `id` is `<issuer>|<subject>` for a person, `key|<key id>` for an API key
    (`Caller.person`, `Caller.key`). Claims and attributes that are not strings are left
    out; only the configured claims reach policies."""

    id: str
    groups: frozenset[str] = frozenset()
    claims: Mapping[str, Any] = field(default_factory=dict)
    attributes: Mapping[str, Any] = field(default_factory=dict)
    client: str = ""
    actor: str = ""  # who acts for the caller (RFC 8693 `act`: `client:<id>`), else ""

    @classmethod
    def person(cls, issuer: str, subject: str, **kw: Any) -> Caller:
        return cls(f"{issuer}|{subject}", **kw)

    @classmethod
    def key(cls, key_id: str, **kw: Any) -> Caller:
        return cls(f"key|{key_id}", **kw)


@dataclass(frozen=True)
class Call:
    """One call: `method` an MCP method (tools/call, resources/read, prompts/get, or a list
    method), `name` the tool or prompt name or the resource URI (empty for a list method)."""

    method: str
    endpoint: str
    name: str = ""
    arguments: Mapping[str, Any] = field(default_factory=dict)
    zone: str = ""
    era: str = ""


@dataclass(frozen=True)
class Verdict:
    """One Cedar evaluation: `policies` are Cedar's reasons (the permits that allowed, or the
    forbids that denied; empty when a deny comes from no permit), `reason` the deciding
    forbid's @reason (or a default text), `errors` the evaluation errors (which deny)."""

    allowed: bool
    policies: tuple[str, ...] = ()
    reason: str = ""
    errors: tuple[str, ...] = ()


@dataclass(frozen=True)
class Decision:
    """What `Policies.decide` returns: the applied decision (`allowed`, `policies`, `reason`,
    `errors`) and `shadow`, the decision over all policies (None when no policy is shadow)."""

    allowed: bool
    policies: tuple[str, ...] = ()
    reason: str = ""
    errors: tuple[str, ...] = ()
    shadow: Verdict | None = None

    @property
    def shadow_denied(self) -> bool:
        """The shadow policies would have refused a call that was let through."""
        return self.allowed and self.shadow is not None and not self.shadow.allowed


ALLOWED = Decision(True)


class Policies:
    """The validated policies compiled for deciding, with the catalog they were validated
    against. Immutable: a change of policies or targets builds a new one."""

    def __init__(self, policies: Sequence[Policy], catalog: Catalog,
                 claims: Sequence[str] = ()) -> None:
        self.policies = tuple(policies)
        self.catalog = catalog
        self.by_id = {p.id: p for p in self.policies}
        self.claims = tuple(claims) or catalog.claims
        enforce = {p.id: p.est for p in self.policies if p.mode == "enforce"}
        self.enforce = cedarpy.PolicySet.from_json_str(policy_set_json(enforce)) if (
            enforce) else None
        self.shadowed = any(p.mode == "shadow" for p in self.policies)
        self.all = cedarpy.PolicySet.from_json_str(policy_set_json(
            {p.id: p.est for p in self.policies})) if self.shadowed else None
        self._targets = {key: _target_json(t) for key, t in catalog.targets.items()}
        # the entities of a (caller, target) pair, parsed by Cedar once: a caller calls again
        self._entities: dict[tuple[str, str], cedarpy.Entities] = {}
        self._partitions: dict[tuple[str, str], tuple[Any, Any]] = {}
        # decisions by request: a caller repeating a call, or calling a tool whose policies
        # read none of its arguments, is answered without Cedar
        self._decided: dict[tuple[bool, str, str, str, str], tuple[Raw, Raw]] = {}
        self._plans: dict[tuple[str, str], Plan] = {}
        self._policy_reads = {p.id: reads_of(p.est.get("conditions", []))
                              for p in self.policies}
        # per target: what its policies read of the context and the input; the rest is left
        # out of the request, so Cedar parses only what a policy can look at
        self._reads: dict[tuple[str, str], Reads] = {}

    @property
    def empty(self) -> bool:
        return not self.policies

    def reason_of(self, policy_id: str) -> str | None:
        policy = self.by_id.get(policy_id)
        return policy.reason if policy is not None else None

    def decide(self, caller: Caller, call: Call, now: dt.datetime | None = None) -> Decision:
        """The decision on one call; never raises for what the caller sent. The target's
        policies that read no argument are answered once per caller and context (`Plan`):
        per call, Cedar evaluates only those that read the arguments."""
        if self.empty:
            return ALLOWED
        kind = CALL_ACTIONS.get(call.method)
        if kind is None:
            return self._decide_whole(caller, call, now)
        uid = f"{call.endpoint}/{call.name}"
        target = self._targets.get((kind, uid)) or _target_json(
            Target(kind, call.endpoint, call.name))  # type: ignore[arg-type]
        caller_json = self.caller_json(caller)
        base = _base_context(call, now)
        plan = self._plan_of(kind, uid)
        try:
            fixed = self._side(plan.fixed, False, (caller.id, caller_json), target, kind, call,
                               base)
            varying = self._side(plan.varying, True, (caller.id, caller_json), target, kind,
                                 call, base)
        except Unrepresentable as exc:
            return self._unrepresentable(exc)
        applied = (self._verdict(combine(fixed[0], varying[0]))
                   if self.enforce is not None else Verdict(True))
        shadow = (self._verdict(combine(fixed[1], varying[1]))
                  if self.all is not None else None)
        return Decision(applied.allowed, applied.policies, applied.reason, applied.errors,
                        shadow)

    def _side(self, side: Side | None, varying: bool, caller: tuple[str, str], target: str,
              kind: str, call: Call, base: dict[str, Any]) -> tuple[Raw, Raw]:
        """Cedar's (enforce, every) answers over one side of a target's plan, kept by request:
        an equal request (caller, target and what the side reads of the context) has an
        equal answer."""
        if side is None:
            return NOTHING, NOTHING
        context = base if side.context is None else {
            k: v for k, v in base.items() if k in side.context}
        if side.reads_input:
            context["input"] = {"uri": call.name} if kind == "Resource" else cedar_input(
                _only(call.arguments, side.input), self.catalog.inputs.get(
                    self.catalog.input_of.get((kind, f"{call.endpoint}/{call.name}"), "")))
        text = orjson.dumps(context).decode()
        key = (varying, caller[1], target, call.method, text)
        found = self._decided.get(key)
        if found is not None:
            return found
        request = {"principal": {"type": _CALLER, "id": caller[0]},
                   "action": {"type": _ACTION, "id": call.method},
                   "resource": {"type": f"{NAMESPACE}::{kind}",
                                "id": f"{call.endpoint}/{call.name}"},
                   "context": text}
        entities = self._entities_of(caller[1], target)
        found = (_raw(side.enforce, request, entities),
                 _raw(side.every, request, entities) if self.all is not None else NOTHING)
        if len(text) <= DECIDED_CONTEXT_MAX:
            if len(self._decided) >= ENTITIES_KEPT:
                self._decided.clear()
            self._decided[key] = found
        return found

    def _plan_of(self, kind: str, uid: str) -> Plan:
        found = self._plans.get((kind, uid))
        if found is None:
            target = self.catalog.get(kind, uid) or Target(kind, *uid.split("/", 1))  # type: ignore[arg-type]
            found = plan((p for p in self.policies if reachable(p.est, [target])),
                         self._policy_reads, policy_set)
            if len(self._plans) >= ENTITIES_KEPT:
                self._plans.clear()
            self._plans[(kind, uid)] = found
        return found

    def _unrepresentable(self, exc: Unrepresentable) -> Decision:
        failed = Verdict(False, (), DEFAULT_ERROR, (str(exc),))
        applied = failed if self.enforce is not None else Verdict(True)
        return Decision(applied.allowed, applied.policies, applied.reason, applied.errors,
                        failed if self.shadowed else None)

    def _decide_whole(self, caller: Caller, call: Call, now: dt.datetime | None) -> Decision:
        """A list method's decision: one evaluation over the whole sets."""
        try:
            request, entities = self.request(caller, call, now)
        except Unrepresentable as exc:
            return self._unrepresentable(exc)
        enforce, every = self.partition(call)
        applied = (self.evaluate(enforce, request, entities)
                   if self.enforce is not None else Verdict(True))
        shadow = self.evaluate(every, request, entities) if self.all is not None else None
        return Decision(applied.allowed, applied.policies, applied.reason, applied.errors,
                        shadow)

    def request(self, caller: Caller, call: Call, now: dt.datetime | None = None,
                arguments: bool = True) -> tuple[dict[str, Any], cedarpy.Entities]:
        """The Cedar request and entities (JSON) for a call; `arguments=False` gives an empty
        input (what listing asks). The context holds only what the policies reaching the
        target read (`Reads`). Raises Unrepresentable for an argument Cedar cannot hold."""
        kind = CALL_ACTIONS.get(call.method)
        context = _base_context(call, now)
        if kind is None:
            resource = {"type": _ENDPOINT, "id": call.endpoint}
            target = json.dumps(_endpoint_json(call.endpoint))
        else:
            uid = f"{call.endpoint}/{call.name}"
            resource = {"type": f"{NAMESPACE}::{kind}", "id": uid}
            target = self._targets.get((kind, uid)) or _target_json(
                Target(kind, call.endpoint, call.name))  # type: ignore[arg-type]
            reads = self._reads_of(kind, uid)
            if reads.input is None or reads.input:
                context["input"] = {} if not arguments else (
                    {"uri": call.name} if kind == "Resource" else cedar_input(
                        _only(call.arguments, reads.input), self.catalog.inputs.get(
                            self.catalog.input_of.get((kind, uid), ""))))
            if reads.context is not None:
                context = {k: v for k, v in context.items() if k in reads.context}
        request = {"principal": {"type": _CALLER, "id": caller.id},
                   "action": {"type": _ACTION, "id": call.method},
                   "resource": resource, "context": orjson.dumps(context).decode()}
        return request, self._entities_of(self.caller_json(caller), target)

    def _reads_of(self, kind: str, uid: str) -> Reads:
        """What the policies reaching this target read of the context and of the input: the
        rest is left out of the request (a policy cannot name it, so no decision changes), and
        neither parsed by Cedar nor converted (a number decimal cannot hold refuses only where
        a policy reads it)."""
        key = (kind, uid)
        reads = self._reads.get(key)
        if reads is None:
            target = self.catalog.get(kind, uid) or Target(kind, *uid.split("/", 1))  # type: ignore[arg-type]
            reach = [p for p in self.policies if reachable(p.est, [target])]
            reads = reads_of(p.est.get("conditions", []) for p in reach)
            if len(self._reads) >= ENTITIES_KEPT:
                self._reads.clear()
            self._reads[key] = reads
        return reads

    def _entities_of(self, caller: str, target: str) -> cedarpy.Entities:
        key = (caller, target)
        entities = self._entities.get(key)
        if entities is None:
            if len(self._entities) >= ENTITIES_KEPT:
                self._entities.clear()  # callers change rarely; simpler than an LRU's locking
            entities = cedarpy.Entities.from_json_str(f"[{caller},{target}]")
            self._entities[key] = entities
        return entities

    def caller_json(self, caller: Caller) -> str:
        claims = {n: caller.claims[n] for n in self.claims
                  if isinstance(caller.claims.get(n), str)}
        attributes = {n: v for n, v in caller.attributes.items()
                      if isinstance(v, str) and n in self.catalog.attributes}
        return orjson.dumps({"uid": {"type": _CALLER, "id": caller.id}, "parents": [],
                             "attrs": {"groups": sorted(caller.groups), "claims": claims,
                                       "attributes": attributes, "client": caller.client,
                                       "actor": caller.actor}},
                            option=orjson.OPT_SORT_KEYS).decode()

    def partition(self, call: Call, relaxed: Any = None) -> tuple[Any, Any]:
        """The (enforce, all) policy sets whose scope can reach the call's target (None: no
        policy does); for a list method, the whole sets. `relaxed` (policies.cedar.listing):
        a function giving a policy's relaxed JSON form, or None to drop it."""
        kind = CALL_ACTIONS.get(call.method)
        if kind is None:
            return self.enforce, self.all
        key = (("relaxed:" if relaxed else "") + kind, f"{call.endpoint}/{call.name}")
        found = self._partitions.get(key)
        if found is None:
            target = self.catalog.get(kind, key[1]) or Target(
                kind, call.endpoint, call.name)  # type: ignore[arg-type]
            reach = {id(p) for p in self.policies if reachable(p.est, [target])}
            forms = {p.id: (p, relaxed(p.est) if relaxed else p.est)
                     for p in self.policies if id(p) in reach}
            enforce = {i: f for i, (p, f) in forms.items() if f and p.mode == "enforce"}
            every = {i: f for i, (p, f) in forms.items() if f}
            found = (policy_set(enforce), policy_set(every))
            if len(self._partitions) >= ENTITIES_KEPT:
                self._partitions.clear()
            self._partitions[key] = found
        return found

    def evaluate(self, policies: Any, request: dict[str, Any],
                 entities: cedarpy.Entities) -> Verdict:
        return self._verdict(_raw(policies, request, entities))

    def _verdict(self, raw: Raw) -> Verdict:
        """A Cedar answer as applied: an error denies, naming it; a deny names the deciding
        forbid's @reason."""
        allowed, reasons, errors = raw
        if errors:
            return Verdict(False, reasons, DEFAULT_ERROR, errors)
        if allowed:
            return Verdict(True, reasons)
        if not reasons:
            return Verdict(False, (), DEFAULT_NO_PERMIT)
        text = next((r for r in map(self.reason_of, reasons) if r), DEFAULT_FORBID)
        return Verdict(False, reasons, text)


def _raw(policies: Any, request: dict[str, Any], entities: cedarpy.Entities) -> Raw:
    if policies is None:
        return NOTHING
    result = authorize(request, policies, entities)
    diagnostics = result.get("diagnostics") or {}
    return (result.get("decision") == "Allow",
            tuple(sorted(diagnostics.get("reason") or ())),
            tuple(str(e) for e in diagnostics.get("errors") or ()))


def _base_context(call: Call, now: dt.datetime | None) -> dict[str, Any]:
    when = now or dt.datetime.now(dt.UTC)
    when = when.astimezone(dt.UTC) if when.tzinfo else when
    return {"hour": when.hour, "weekday": when.isoweekday(), "zone": call.zone, "era": call.era}


def _endpoint_json(endpoint: str) -> dict[str, Any]:
    return {"uid": {"type": _ENDPOINT, "id": endpoint}, "attrs": {}, "parents": []}


def _target_json(target: Target) -> str:
    """The target's entity and its endpoint's, as the inside of a JSON array."""
    attrs: dict[str, Any] = {"endpoint": target.endpoint, "name": target.name}
    attrs.update({k: v for k, v in sorted(target.annotations.items())
                  if k in ANNOTATIONS and isinstance(v, bool)})
    entity = {"uid": {"type": f"{NAMESPACE}::{target.kind}", "id": target.uid},
              "attrs": attrs, "parents": [{"type": _ENDPOINT, "id": target.endpoint}]}
    return f"{json.dumps(entity)},{json.dumps(_endpoint_json(target.endpoint))}"


def authorize(request: dict[str, Any], policies: Any, entities: cedarpy.Entities
              ) -> dict[str, Any]:
    """Cedar's answer to one request, as its JSON object ("decision", "diagnostics").
    cedarpy's `is_authorized` wraps the engine's batch call in a list, re-encodes a context
    already in JSON, and builds result objects through the standard json module: about a
    sixth of a decision (bench/cedar_decide.py). The engine's call is made here directly, with
    the context as JSON text; tests/policies/cedar/test_decide.py checks that it answers as
    `is_authorized` does, so a cedarpy upgrade that changes it fails there."""
    if _BATCH is None:  # pragma: no cover - a cedarpy without the engine module
        result = cedarpy.is_authorized(request, policies, entities)
        return {"decision": "Allow" if result.allowed else "Deny",
                "diagnostics": {"reason": result.diagnostics.reasons,
                                "errors": result.diagnostics.errors}}
    answer: dict[str, Any] = orjson.loads(_BATCH([request], policies, entities._inner,
                                                 None, False)[0])
    return answer


_BATCH = getattr(getattr(cedarpy, "_internal", None), "is_authorized_batch", None)


def _only(arguments: Mapping[str, Any], names: frozenset[str] | None) -> Mapping[str, Any]:
    if names is None:
        return arguments
    return {k: v for k, v in arguments.items() if k in names}
