"""The worked examples of the docs' Policies page (docs/policies.md) are valid Cedar against the
schema the gateway generates for the tools they name, and decide as the page says."""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path

from policies.cedar import Call, Caller, Catalog, Policies, Target, parse, validate

PAGE = Path(__file__).resolve().parents[3] / "docs" / "policies.md"
TOOLS = [
    Target.tool("pay", {"name": "transfer", "inputSchema": {
        "type": "object", "properties": {"amount": {"type": "integer"}, "to": {"type": "string"}},
        "required": ["amount", "to"]}, "annotations": {"destructiveHint": True}}),
    Target.tool("github", {"name": "create_issue", "inputSchema": {
        "type": "object", "properties": {"repo": {"type": "string"},
                                         "title": {"type": "string"},
                                         "labels": {"type": "array", "items": {"type": "string"}}},
        "required": ["repo", "title"]}}),
    Target.tool("github", {"name": "search", "inputSchema": {"type": "object"},
                           "annotations": {"readOnlyHint": True}}),
    Target.tool("ledger", {"name": "post", "inputSchema": {"type": "object"}}),
    Target.tool("eu-crm", {"name": "lookup", "inputSchema": {"type": "object"}}),
]
MONDAY_NOON = dt.datetime(2026, 12, 7, 12, tzinfo=dt.UTC)


def examples() -> str:
    text = PAGE.read_text()
    return re.search(r"```cedar\n(.*?)```", text, re.DOTALL).group(1)  # type: ignore[union-attr]


def test_the_policies_page_examples_validate_and_decide_as_it_says() -> None:
    catalog = Catalog(TOOLS, claims=["department"], attributes=["region"])
    policies = parse(examples(), "docs/policies.md")
    validate(policies, catalog)  # raises naming the policy on any fault
    assert [p.id for p in policies] == ["small-payments", "security-label", "finance-only",
                                        "read-only", "office-hours", "eu-data"]
    decide = Policies(policies, catalog).decide
    alice = Caller.person("https://idp.example", "alice", groups=frozenset({"dev"}),
                          claims={"department": "finance"}, attributes={"region": "eu"})
    small = Call("tools/call", "pay", "transfer", {"amount": 100, "to": "bob"}, zone="lan")
    assert decide(alice, small, MONDAY_NOON).allowed
    assert not decide(alice, Call("tools/call", "pay", "transfer", {"amount": 900, "to": "b"},
                                  zone="lan"), MONDAY_NOON).allowed
    outside = decide(alice, Call("tools/call", "pay", "transfer", {"amount": 1, "to": "b"},
                                 zone="remote"), MONDAY_NOON)
    assert not outside.allowed and outside.policies == ("office-hours",)
    assert decide(alice, Call("tools/call", "github", "search", {}), MONDAY_NOON).allowed
    labelled = decide(alice, Call("tools/call", "github", "create_issue", {
        "repo": "a/b", "title": "x", "labels": ["security"]}), MONDAY_NOON)
    assert not labelled.allowed and labelled.reason == "only the security team files security issues"
    assert decide(alice, Call("tools/call", "ledger", "post", {}), MONDAY_NOON).allowed
    bob = Caller.person("https://idp.example", "bob", claims={"department": "sales"},
                        attributes={"region": "us"})
    assert not decide(bob, Call("tools/call", "ledger", "post", {}), MONDAY_NOON).allowed
    assert not decide(bob, Call("tools/call", "eu-crm", "lookup", {}), MONDAY_NOON).allowed
