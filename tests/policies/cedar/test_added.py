"""The Cedar gate with policies added while it runs (the management API's, `Gate(added=)`): a
change is taken on the next call (the audit's version moves with it), an empty gate governs
nothing, a file's fault stops the load while an added one's refuses what it governs, and
`admits` validates a change as the gate would."""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest

from policies.cedar.book import TargetBook
from policies.cedar.gate import Gate
from policies.cedar.load import Policy, PolicyError, parse
from proxy.auth.principal import Principal
from proxy.chain import CallContext
from proxy.errors import ToolResultDenial
from proxy.jsonrpc import McpMessage
from tests.policies.cedar.helpers import TOOLS

OPEN = 'permit(principal, action, resource in Tollhouse::Endpoint::"pay");'
BIG = ('@reason("not to mallory")\nforbid(principal, action == Tollhouse::Action::"tools/call", '
       'resource == Tollhouse::Tool::"pay/transfer") when { context.input.to == "mallory" };')


@dataclass
class Added:
    version: int = 0
    policies: tuple[Policy, ...] = ()

    def set(self, *texts: str) -> None:
        self.policies = tuple(replace(parse(t, "api")[0], id=f"p{n}")
                              for n, t in enumerate(texts))
        self.version += 1


def transfer(to: str) -> McpMessage:
    return McpMessage("request", 1, "tools/call",
                      {"name": "transfer", "arguments": {"amount": 5, "to": to}}, b"")


def context(endpoint: str = "pay") -> CallContext:
    return CallContext(principal=Principal(subject="alice"), endpoint=endpoint,
                       upstream_url="http://up")


def book() -> TargetBook:
    return TargetBook(TOOLS)


async def test_an_added_policy_decides_from_the_next_call() -> None:
    added = Added()
    gate = Gate([], book(), added=added)
    assert not gate.governs("pay") and gate.policies == ()
    ctx = context()
    await gate.check(transfer("mallory"), ctx)
    assert ctx.policy is None  # nothing governs: nothing decided, nothing recorded
    listing = McpMessage("request", 2, "tools/list", {}, b"")
    assert gate.rewriter(listing, ctx) is None and not gate.hides(listing, ctx)
    added.set(OPEN, BIG)
    with pytest.raises(ToolResultDenial) as refused:
        await gate.check(transfer("mallory"), context())
    assert refused.value.policy is not None and refused.value.policy["policies"] == ["p1"]
    first = gate.version
    await gate.check(transfer("bob"), ok := context())
    assert ok.policy is not None and ok.policy["decision"] == "allow"
    assert ok.policy["version"] == first
    added.set(OPEN)  # the forbid deleted
    await gate.check(transfer("mallory"), later := context())
    assert later.policy is not None and later.policy["version"] != first
    assert gate.rewriter(listing, later) is not None  # it governs "pay" now: it learns
    added.set()
    assert not gate.governs("pay")


async def test_shadow_mode_applies_to_added_policies() -> None:
    added = Added()
    added.set(OPEN, BIG)
    gate = Gate([], book(), added=added, mode="shadow")
    ctx = context()
    await gate.check(transfer("mallory"), ctx)  # shadow: nothing is refused
    assert ctx.policy is not None and ctx.policy["shadow"] == "deny"


async def test_a_shadow_evaluation_error_is_audited_as_one_and_refuses_nothing() -> None:
    """A shadow policy that fails to evaluate (an overflow) lets the call through; the audit
    object says the shadow decision was an error, not a shadow policy's refusal (the console
    counts them apart)."""
    added = Added()
    added.set(OPEN, '@mode("shadow")\nforbid(principal, action == Tollhouse::Action::'
                    '"tools/call", resource == Tollhouse::Tool::"pay/transfer") when { '
                    'context.input has count && context.input.count * 9223372036854775807 > 1 };')
    gate = Gate([], book(), added=added)
    call = McpMessage("request", 1, "tools/call", {"name": "transfer", "arguments": {
        "amount": 5, "to": "bob", "count": 2}}, b"")
    await gate.check(call, ctx := context())
    assert ctx.policy is not None and ctx.policy["decision"] == "allow"
    assert ctx.policy["shadow"] == "deny" and ctx.policy["shadow_errors"] == 1
    assert "errors" not in ctx.policy


async def test_an_added_policy_that_does_not_validate_refuses_what_it_governs() -> None:
    added = Added()
    added.set(OPEN, 'forbid(principal, action, resource in Tollhouse::Endpoint::"pay") '
                    'when { principal.nosuch == "x" };')
    gate = Gate([], book(), added=added)  # no error: the API's fault is not the file's
    with pytest.raises(ToolResultDenial) as refused:
        await gate.check(transfer("bob"), context())
    assert refused.value.policy is not None and refused.value.policy["errors"] == 1
    await gate.check(transfer("bob"), context("github"))  # not governed: not refused
    added.set(OPEN)  # fixed through the API
    await gate.check(transfer("bob"), fixed := context())
    assert fixed.policy is not None and fixed.policy["decision"] == "allow"


def test_a_files_fault_still_stops_the_load() -> None:
    bad = parse('permit(principal, action, resource) when { principal.nosuch == "x" };',
                "f.cedar")
    with pytest.raises(PolicyError, match="nosuch"):
        Gate(bad, book(), added=Added())


async def test_an_id_used_by_a_file_and_an_added_policy_refuses() -> None:
    filed = [replace(parse(OPEN, "f.cedar")[0], id="p0")]
    added = Added()
    gate = Gate(filed, book(), added=added)
    added.set(OPEN)  # p0 as well: made elsewhere, as the API refuses it
    with pytest.raises(ToolResultDenial):
        await gate.check(transfer("bob"), context())


def test_admits_validates_a_change_as_the_gate_would() -> None:
    filed = [replace(parse(OPEN, "f.cedar")[0], id="filed")]
    gate = Gate(filed, book(), added=Added())
    gate.admits([replace(parse(BIG, "api")[0], id="big")])
    with pytest.raises(PolicyError, match=r"policy big: .*amout"):
        gate.admits([replace(parse(BIG.replace("input.to", "input.amout"), "api")[0],
                             id="big")])
    with pytest.raises(PolicyError, match="also used"):
        gate.admits([replace(parse(BIG, "api")[0], id="filed")])
