"""How a target's policies are decided per call (`Plan`), and how two partial Cedar answers
combine into the answer over both (`combine`).

A target's reaching policies split in two: the *fixed* ones read none of the call's arguments
(`context.input`), so their answer depends only on the caller, the target and what they read of
the rest of the context (hour, weekday, zone, era): it is computed once and kept. The *varying*
ones read the arguments and are evaluated per call, over only themselves. Cedar's decision over
the union follows from the two answers exactly, reasons included: any satisfied forbid denies
(the reasons are every satisfied forbid), else any satisfied permit allows (the reasons are
every satisfied permit), else no permit denies; the errors add up. A Cedar answer names its
satisfied forbids when it denies with reasons, its satisfied permits when it allows, and
neither when it denies without reasons, so each side's forbids and permits are known.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import cedarpy

from policies.cedar.load import Policy, policy_set_json

# Cedar's answer as (allowed, reasons, errors): the reasons are the satisfied forbids when it
# denies, the satisfied permits when it allows
Raw = tuple[bool, tuple[str, ...], tuple[str, ...]]
NOTHING: Raw = (False, (), ())


@dataclass(frozen=True)
class Side:
    """Some of a target's policies: `enforce` and `every` the Cedar policy sets (enforce mode
    only, and all modes; None when empty), `context` the context attributes they read
    (None: all of them), `input` the argument names they read (None: all of them)."""

    enforce: Any
    every: Any
    context: frozenset[str] | None
    input: frozenset[str] | None

    @property
    def reads_input(self) -> bool:
        return self.context is None or "input" in self.context


@dataclass(frozen=True)
class Plan:
    """A target's policies split into those read once per caller (`fixed`) and those read per
    call (`varying`); either is None when no reaching policy is of its kind."""

    fixed: Side | None
    varying: Side | None


def plan(reach: Iterable[Policy], reads: Mapping[str, Reads], sets: Any) -> Plan:
    """The plan over the reaching policies: `reads` maps a policy id to its `Reads`, `sets` builds a Cedar policy set from {id: JSON form}."""
    fixed: list[Policy] = []
    varying: list[Policy] = []
    for p in reach:
        r = reads[p.id]
        (fixed if r.context is not None and "input" not in r.context else varying).append(p)
    return Plan(_side(fixed, reads, sets), _side(varying, reads, sets))


def _side(policies: list[Policy], reads: Mapping[str, Reads], sets: Any) -> Side | None:
    if not policies:
        return None
    context: set[str] | None = set()
    names: set[str] | None = set()
    for p in policies:
        r = reads[p.id]
        context = None if context is None or r.context is None else context | r.context
        names = None if names is None or r.input is None else names | r.input
    enforce = {p.id: p.est for p in policies if p.mode == "enforce"}
    return Side(sets(enforce) if enforce else None, sets({p.id: p.est for p in policies}),
                None if context is None else frozenset(context),
                None if names is None else frozenset(names))


def policy_set(forms: dict[str, Any]) -> Any:
    """The Cedar policy set of {id: JSON form} (None when empty)."""
    return cedarpy.PolicySet.from_json_str(policy_set_json(forms)) if forms else None


def combine(a: Raw, b: Raw) -> Raw:
    """Cedar's answer over the union of two disjoint policy sets, from the answer over each."""
    forbids = (() if a[0] else a[1]) + (() if b[0] else b[1])
    permits = (a[1] if a[0] else ()) + (b[1] if b[0] else ())
    allowed = not forbids and bool(permits)
    return allowed, tuple(sorted(forbids or permits)), a[2] + b[2]


@dataclass(frozen=True)
class Reads:
    """What some policies read of a call's context: `context` the attributes (None: the
    context as a whole) and `input` the top-level argument names (None: the whole input)."""

    context: frozenset[str] | None
    input: frozenset[str] | None


def reads_of(conditions: Iterable[Any]) -> Reads:
    """What the conditions read (`context.x`, `context has x`, `context.input.y`,
    `context.input has y`)."""
    attrs: set[str] | None = set()
    names: set[str] | None = set()
    for condition in conditions:
        found = _reads(condition, attrs, names)
        if found == "context":
            attrs = names = None
            break
        if found == "input":
            names = None
    if attrs is not None and names is None:
        attrs.add("input")
    return Reads(None if attrs is None else frozenset(attrs),
                 None if names is None else frozenset(names))


def _reads(expr: Any, attrs: set[str] | None, names: set[str] | None) -> str:
    """Add what `expr` reads of the context to `attrs` and of the input to `names`:
    "context" when it reads the context as a whole, "input" the input as a whole, else ""."""
    if isinstance(expr, list):
        return _worst(_reads(e, attrs, names) for e in expr)
    if not isinstance(expr, dict):
        return ""
    if expr.get("Var") == "context":
        return "context"  # `context` itself (only its attributes are read through `.`)
    for op in (".", "has"):
        inner = expr.get(op)
        if isinstance(inner, dict) and inner.get("left") == _INPUT:
            if names is not None:
                names.add(str(inner.get("attr")))
            if attrs is not None:
                attrs.add("input")
            return ""
        if isinstance(inner, dict) and inner.get("left") == _CONTEXT:
            attr = str(inner.get("attr"))
            if attrs is not None:
                attrs.add(attr)
            return "input" if attr == "input" else ""
    return _worst(_reads(v, attrs, names) for v in expr.values())


def _worst(found: Iterable[str]) -> str:
    seen = set(found)
    return "context" if "context" in seen else "input" if "input" in seen else ""


_CONTEXT: dict[str, Any] = {"Var": "context"}
_INPUT: dict[str, Any] = {".": {"left": _CONTEXT, "attr": "input"}}
