"""The Cedar schema (JSON form, namespace `Tollhouse`) generated from the configured claim
names, the person attribute names and the targets (tools, prompts, resources) as last seen.

Cedar gives an action one context type, but `tools/call`'s `context.input` is a different
record for every tool. So the schema is a family: `Catalog.base()` is the schema with an empty
`input` for every call action, and `Catalog.variant(tool_key, prompt_key)` the same schema
with `tools/call`'s input typed as one tool's arguments and `prompts/get`'s as one prompt's.
A policy is validated (policies.cedar.load) against the variants of every tool and prompt its
scope can reach, so `context.input.amount` is accepted exactly when every tool the policy can
apply to has an `amount` argument of a type that fits (guard it with `context.input has amount`
when only some do). `resources/read`'s input is always `{uri: String}`.

JSON Schema -> Cedar: string -> String, integer -> Long, number -> decimal (Cedar's fixed
point, four fractional digits; a value it cannot hold exactly refuses the call, see
policies.cedar.values), boolean -> Boolean, object -> Record (its `required` properties
required, the others optional), array -> Set of its items' type. An argument whose schema is
none of these (no type, a union other than `[T, "null"]`, an array without items, deeper than
`MAX_DEPTH`) is not declared: a policy naming it is refused at load time.

Everything here is pure and deterministic (sorted keys), and cheap enough to redo whenever a
list of tools changes.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

NAMESPACE = "Tollhouse"
ANNOTATIONS = ("destructiveHint", "idempotentHint", "openWorldHint", "readOnlyHint")
CALL_ACTIONS: dict[str, str] = {
    "tools/call": "Tool", "resources/read": "Resource", "prompts/get": "Prompt"}
LIST_ACTIONS = ("prompts/list", "resources/list", "resources/templates/list", "tools/list")
MAX_DEPTH = 8
Kind = Literal["Tool", "Prompt", "Resource"]

_BOOL = {"type": "Boolean", "required": False}
_STRING = {"type": "String"}
_DECIMAL = {"type": "Extension", "name": "decimal"}
_SCALARS: dict[str, dict[str, Any]] = {
    "string": _STRING, "integer": {"type": "Long"}, "number": _DECIMAL,
    "boolean": {"type": "Boolean"}}
_RESOURCE_INPUT: dict[str, Any] = {"type": "Record", "attributes": {"uri": dict(_STRING)}}
EMPTY_INPUT: dict[str, Any] = {"type": "Record", "attributes": {}}


@dataclass(frozen=True)
class Target:
    """One tool, prompt or resource of an endpoint as last seen. `input_schema` is the tool's
    `inputSchema` (a prompt's arguments as `Target.prompt` makes them); `annotations` the
    tool's hints (readOnlyHint, destructiveHint, idempotentHint, openWorldHint)."""

    kind: Kind
    endpoint: str
    name: str
    input_schema: Mapping[str, Any] | None = None
    annotations: Mapping[str, Any] = field(default_factory=dict)

    @property
    def uid(self) -> str:
        return f"{self.endpoint}/{self.name}"

    @classmethod
    def tool(cls, endpoint: str, tool: Mapping[str, Any]) -> Target:
        """From one entry of a tools/list answer."""
        schema = tool.get("inputSchema")
        hints = tool.get("annotations")
        return cls("Tool", endpoint, str(tool["name"]),
                   schema if isinstance(schema, Mapping) else None,
                   hints if isinstance(hints, Mapping) else {})

    @classmethod
    def prompt(cls, endpoint: str, prompt: Mapping[str, Any]) -> Target:
        """From one entry of a prompts/list answer: its arguments are strings."""
        args = [a for a in prompt.get("arguments") or () if isinstance(a, Mapping)]
        schema = {"type": "object",
                  "properties": {str(a["name"]): {"type": "string"} for a in args if "name" in a},
                  "required": [str(a["name"]) for a in args if a.get("required") and "name" in a]}
        return cls("Prompt", endpoint, str(prompt["name"]), schema)


def input_type(schema: Mapping[str, Any] | None) -> dict[str, Any]:
    """The Cedar record type of a call's arguments, from a tool's `inputSchema`."""
    if not isinstance(schema, Mapping):
        return dict(EMPTY_INPUT)
    record = _cedar_type(schema, 0)
    if record is None or record.get("type") != "Record":
        return dict(EMPTY_INPUT)
    return record


def _json_type(schema: Mapping[str, Any]) -> str | None:
    kind = schema.get("type")
    if isinstance(kind, list):
        kinds = [k for k in kind if k != "null"]
        kind = kinds[0] if len(kinds) == 1 else None
    if kind is None and isinstance(schema.get("properties"), Mapping):
        kind = "object"
    if kind is None and isinstance(schema.get("enum"), list) and schema["enum"] and all(
            isinstance(v, str) for v in schema["enum"]):
        kind = "string"
    return kind if isinstance(kind, str) else None


def _cedar_type(schema: Mapping[str, Any], depth: int) -> dict[str, Any] | None:
    if depth > MAX_DEPTH:
        return None
    kind = _json_type(schema)
    if kind in _SCALARS:
        return dict(_SCALARS[kind])
    if kind == "array":
        items = schema.get("items")
        element = _cedar_type(items, depth + 1) if isinstance(items, Mapping) else None
        return None if element is None else {"type": "Set", "element": element}
    if kind != "object":
        return None
    props = schema.get("properties")
    required = schema.get("required")
    needed = set(required) if isinstance(required, list) else set()
    attributes: dict[str, Any] = {}
    for name, sub in sorted((props or {}).items()) if isinstance(props, Mapping) else ():
        typed = _cedar_type(sub, depth + 1) if isinstance(sub, Mapping) else None
        if typed is not None:
            attributes[str(name)] = {**typed, "required": name in needed}
    return {"type": "Record", "attributes": attributes}


def type_key(record: Mapping[str, Any]) -> str:
    """A short stable name for an input type: equal types share a variant."""
    return hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()[:16]


class Catalog:
    """The targets as last seen and the names that shape the schema; `base()` and `variant()`
    build the schema's JSON (as a dict). Immutable once made."""

    def __init__(self, targets: Iterable[Target] = (), claims: Iterable[str] = (),
                 attributes: Iterable[str] = ()) -> None:
        self.targets: dict[tuple[str, str], Target] = {
            (t.kind, t.uid): t for t in sorted(targets, key=lambda t: (t.kind, t.uid))}
        self.claims = tuple(sorted(set(claims)))
        self.attributes = tuple(sorted(set(attributes)))
        self.inputs: dict[str, dict[str, Any]] = {}  # type_key -> record
        self.input_of: dict[tuple[str, str], str] = {}  # (kind, uid) -> type_key
        for key, target in self.targets.items():
            record = _RESOURCE_INPUT if target.kind == "Resource" else input_type(
                target.input_schema)
            tkey = type_key(record)
            self.inputs.setdefault(tkey, record)
            self.input_of[key] = tkey
        self.empty_key = type_key(EMPTY_INPUT)
        self.inputs.setdefault(self.empty_key, dict(EMPTY_INPUT))

    def endpoints(self) -> list[str]:
        return sorted({t.endpoint for t in self.targets.values()})

    def get(self, kind: str, uid: str) -> Target | None:
        return self.targets.get((kind, uid))

    def base(self) -> dict[str, Any]:
        """The schema with an empty `input` for tools/call and prompts/get."""
        return self.variant(self.empty_key, self.empty_key)

    def variant(self, tool_key: str, prompt_key: str) -> dict[str, Any]:
        """The schema with tools/call's input typed as `tool_key` and prompts/get's as
        `prompt_key` (keys of `self.inputs`)."""
        inputs = {"Tool": self.inputs[tool_key], "Prompt": self.inputs[prompt_key],
                  "Resource": _RESOURCE_INPUT}
        actions: dict[str, Any] = {}
        for method, kind in sorted(CALL_ACTIONS.items()):
            actions[method] = _applies(kind, {**_context(), "input": inputs[kind]})
        for method in LIST_ACTIONS:
            actions[method] = _applies("Endpoint", _context())
        return {NAMESPACE: {"entityTypes": self._entity_types(), "actions": actions}}

    def _entity_types(self) -> dict[str, Any]:
        def optional_strings(names: tuple[str, ...]) -> dict[str, Any]:
            return {"type": "Record",
                    "attributes": {n: {"type": "String", "required": False} for n in names}}

        caller = {"type": "Record", "attributes": {
            "attributes": optional_strings(self.attributes),
            "claims": optional_strings(self.claims),
            "client": dict(_STRING),
            "actor": dict(_STRING),
            "groups": {"type": "Set", "element": dict(_STRING)}}}
        target = {"type": "Record", "attributes": {
            **{a: dict(_BOOL) for a in ANNOTATIONS},
            "endpoint": dict(_STRING), "name": dict(_STRING)}}
        return {"Caller": {"shape": caller}, "Endpoint": {},
                **{kind: {"memberOfTypes": ["Endpoint"], "shape": target}
                   for kind in ("Prompt", "Resource", "Tool")}}

    def schema_json(self) -> str:
        """The base schema as sorted, indented JSON (what `tollhouse policy schema` prints,
        with the per-target input types beside it)."""
        doc = {"schema": self.base(),
               "inputs": {f"{kind}::{uid}": self.inputs[key]
                          for (kind, uid), key in sorted(self.input_of.items())}}
        return json.dumps(doc, indent=2, sort_keys=True)


def _context() -> dict[str, Any]:
    return {"era": dict(_STRING), "hour": {"type": "Long"}, "weekday": {"type": "Long"},
            "zone": dict(_STRING)}


def _applies(resource: str, context: dict[str, Any]) -> dict[str, Any]:
    return {"appliesTo": {"principalTypes": ["Caller"], "resourceTypes": [resource],
                          "context": {"type": "Record", "attributes": context}}}
