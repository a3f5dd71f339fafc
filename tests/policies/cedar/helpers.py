"""A catalog of tools with typed arguments, and policies compiled from text, for the Cedar
tests."""

from __future__ import annotations

import datetime as dt
from typing import Any

from policies.cedar import Call, Caller, Catalog, Policies, Target, parse, validate

NOON_MONDAY = dt.datetime(2026, 1, 5, 12, 0, tzinfo=dt.UTC)

TOOLS: list[Target] = [
    Target.tool("pay", {
        "name": "transfer",
        "inputSchema": {"type": "object", "required": ["amount", "to"], "properties": {
            "amount": {"type": "number"}, "count": {"type": "integer"},
            "to": {"type": "string"},
            "meta": {"type": "object", "properties": {
                "tags": {"type": "array", "items": {"type": "string"}},
                "origin": {"type": "object", "properties": {"country": {"type": "string"}}}}}}},
        "annotations": {"destructiveHint": True}}),
    Target.tool("pay", {"name": "balance", "inputSchema": {"type": "object", "properties": {}},
                        "annotations": {"readOnlyHint": True}}),
    Target.tool("github", {
        "name": "create_issue",
        "inputSchema": {"type": "object", "required": ["repo"], "properties": {
            "repo": {"type": "string"}, "title": {"type": "string"}}}}),
    Target.prompt("github", {"name": "summary", "arguments": [{"name": "repo", "required": True}]}),
]


def catalog(claims: tuple[str, ...] = ("department",)) -> Catalog:
    return Catalog(TOOLS, claims=claims, attributes=("team",))


def compiled(text: str, mode: str = "enforce", file: str = "t.cedar") -> Policies:
    cat = catalog()
    policies = parse(text, file, mode)  # type: ignore[arg-type]
    validate(policies, cat)
    return Policies(policies, cat)


def alice(**kw: Any) -> Caller:
    return Caller.person("https://idp.example", "alice", **kw)


def call(tool: str, endpoint: str = "pay", **arguments: Any) -> Call:
    return Call("tools/call", endpoint, tool, arguments)
