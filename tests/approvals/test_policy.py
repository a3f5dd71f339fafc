"""The approval gate as a policy, with plain objects: which calls a rule holds (endpoints,
tool globs, a Cedar `when`), what an approval is bound to, single use, and the bound on a
caller's pending approvals; and a `when` that is not Cedar refused at load in one line."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from policies.approvals import MAX_PENDING, Approvals, TooManyPending
from policies.cedar.book import TargetBook
from policies.cedar.load import PolicyError
from proxy.auth.principal import Principal
from proxy.chain import CallContext
from proxy.config.approvals import ApprovalRule
from proxy.errors import ApprovalRequired
from proxy.jsonrpc import McpMessage, parse
from proxy.state.approvals import MemoryApprovals


def call(tool: str, **arguments: Any) -> McpMessage:
    return parse(orjson.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                                          "params": {"name": tool, "arguments": arguments}}))


def ctx(who: str = "bob", endpoint: str = "github") -> CallContext:
    return CallContext(Principal(who, issuer="iss"), endpoint, "")


def gate(store: MemoryApprovals, version: str = "v1", **rule: Any) -> Approvals:
    table = {"name": "prod-writes", "endpoints": ["github"], "tools": ["create_*", "delete_*"],
             "approvers": ["group:sre"], **rule}
    return Approvals([ApprovalRule(**table)], store, TargetBook(),
                     link=lambda i: f"https://gw/console/approvals/{i}",
                     cedar_version=lambda: version)


async def test_only_the_calls_a_rule_names_are_held() -> None:
    policy = gate(MemoryApprovals(), when='context.input.repo like "acme/prod-*"')
    await policy.check(call("create_issue", repo="acme/dev"), ctx())  # `when` is false
    await policy.check(call("list_issues", repo="acme/prod-1"), ctx())  # no glob
    await policy.check(call("create_issue", repo="acme/prod-1"), ctx(endpoint="other"))
    with pytest.raises(ApprovalRequired) as held:
        await policy.check(call("create_issue", repo="acme/prod-1"), ctx())
    assert held.value.approval.rule == "prod-writes" and held.value.new
    assert held.value.details["approval_url"].endswith(held.value.approval.id)


async def test_a_grant_is_bound_to_the_exact_call_and_used_once() -> None:
    store = MemoryApprovals()
    policy = gate(store)
    with pytest.raises(ApprovalRequired) as held:
        await policy.check(call("delete_repo", name="x"), ctx())
    approval = held.value.approval
    assert (await store.decide(approval.id, True, "alice", ""))[0] == "decided"
    for other, context in ((call("delete_repo", name="y"), ctx()),  # other arguments
                           (call("delete_repo", name="x"), ctx("eve")),  # another caller
                           (call("delete_fork", name="x"), ctx())):  # another tool
        with pytest.raises(ApprovalRequired) as again:
            await policy.check(other, context)
        assert again.value.approval.id != approval.id
    changed = gate(store, version="v2")  # the Cedar policies moved
    with pytest.raises(ApprovalRequired):
        await changed.check(call("delete_repo", name="x"), ctx())
    used = ctx()
    await policy.check(call("delete_repo", name="x"), used)  # the one it was given for
    assert used.approval == {"id": approval.id, "rule": "prod-writes", "decision": "approved",
                             "approver": "alice"}
    with pytest.raises(ApprovalRequired) as after:  # single use
        await policy.check(call("delete_repo", name="x"), ctx())
    assert after.value.approval.id != approval.id


async def test_a_caller_holds_a_bounded_number_of_pending_approvals() -> None:
    policy = gate(MemoryApprovals())
    for n in range(MAX_PENDING):
        with pytest.raises(ApprovalRequired):
            await policy.check(call("create_issue", n=n), ctx())
    with pytest.raises(TooManyPending) as full:
        await policy.check(call("create_issue", n=-1), ctx())
    assert full.value.tool_code == "gateway.approval.too_many"
    with pytest.raises(ApprovalRequired):  # another caller is not held back
        await policy.check(call("create_issue", n=-1), ctx("carol"))


def test_a_when_that_is_not_cedar_is_refused_in_one_line() -> None:
    with pytest.raises(PolicyError) as bad:
        gate(MemoryApprovals(), when="context.input.repo like")
    assert "prod-writes" in str(bad.value) and "\n" not in str(bad.value)
    with pytest.raises(PolicyError) as unknown:
        gate(MemoryApprovals(), when='principal.departmnet == "x"')
    assert "departmnet" in str(unknown.value)
