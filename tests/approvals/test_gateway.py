"""Approval gates through the real gateway: an official-SDK upstream (SSE on sessions, or
stateless JSON) behind endpoint `up`, called by the official SDK client in both eras. A call a
rule names is held until a person decides: approved in time it runs, denied it answers seed
001's `gateway.approval.denied`, undecided it answers `gateway.approval.pending` and the same
call retried after the approval runs once; changed arguments void the approval. Each is
audited: the call's record names the approval, each decision is a record of its own."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import orjson
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError

from proxy.approvals import Approvals, Approver
from proxy.audit import query
from proxy.state.approvals import Approval
from tests.e2e.conftest import Stack, open_stack
from tests.policies.cedar.test_gateway import Bank

SRE = Approver("alice", frozenset({"sre"}))


def rules(wait_s: float = 30.0, **more: Any) -> dict[str, Any]:
    return {"approvals": [{"name": "transfers", "endpoints": ["up"], "tools": ["trans*"],
                           "approvers": ["group:sre"], "wait_s": wait_s, **more}]}


@asynccontextmanager
async def gateway(tmp_path: Path, bank: Bank, json: bool = False,
                  config: dict[str, Any] | None = None) -> AsyncIterator[Stack]:
    async with open_stack(tmp_path, lambda: (bank.app(json), None), config=config or rules(),
                          screening={"mode": "off"}) as stack:
        yield stack


async def pending(stack: Stack, count: int = 1) -> list[Approval]:
    """The pending approvals, once there are `count` of them (a deadline, no sleep-and-hope)."""
    deadline = time.monotonic() + 10
    while True:  # (a sessionless client's first request may be what starts the app)
        found = [] if stack.state.gateway is None else await approvals(stack).store.pending()
        if len(found) >= count:
            return found
        assert time.monotonic() < deadline, "no approval was asked for"
        await asyncio.sleep(0.01)


async def decide_when_asked(stack: Stack, approve: bool, comment: str = "",
                            who: Approver = SRE) -> Approval:
    (approval,) = await pending(stack)
    kind, decided = await approvals(stack).decide(approval.id, approve, who, comment)
    assert kind == "decided" and decided is not None
    return decided


def approvals(stack: Stack) -> Approvals:
    held = stack.gateway.calls.approvals
    assert held is not None
    return held


def records(stack: Stack) -> list[dict[str, Any]]:
    rows = [r for r in query(stack.db_path, limit=200)
            if r["method"] == "tools/call" or (r["method"] or "").startswith("approvals/")]
    for row in rows:
        row["policy"] = orjson.loads(row["policy"]) if row["policy"] else None
    return rows[::-1]


@pytest.mark.parametrize("answers", ["sse", "json"])
@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
async def test_a_held_call_runs_once_approved_in_time(tmp_path: Path, mode: str,
                                                      answers: str) -> None:
    bank = Bank()
    async with gateway(tmp_path, bank, json=answers == "json") as stack, \
            Client(f"{stack.gateway_url}/mcp/up", mode=mode) as client:
        assert (await client.call_tool("balance", {})).content[0].text == "42"  # no rule
        deciding = asyncio.create_task(decide_when_asked(stack, True, "ok"))
        sent = await client.call_tool("transfer", {"amount": 100, "to": "bob"})
        approval = await deciding
        spent = await approvals(stack).store.get(approval.id)  # (Redis: before it closes)
    assert not sent.is_error and sent.content[0].text == "sent 100 to bob"
    assert bank.calls == [("balance", {}), ("transfer", {"amount": 100, "to": "bob"})]
    rows = records(stack)
    assert sorted((r["method"], r["tool"], r["status"]) for r in rows) == [
        ("approvals/approve", "transfer", "ok"), ("tools/call", "balance", "ok"),
        ("tools/call", "transfer", "ok")]
    (decision,) = [r for r in rows if r["method"] == "approvals/approve"]
    call = [r for r in rows if r["method"] == "tools/call"][-1]
    assert decision["principal"] == "alice" and decision["note"] == "ok"
    used = call["policy"]["approval"]
    assert used["id"] == approval.id and used["decision"] == "approved"
    assert used["approver"] == "alice" and used["wait_ms"] >= 0
    assert spent is not None and spent.status == "used"


@pytest.mark.parametrize("answers", ["sse", "json"])
@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
async def test_a_denied_call_is_refused_with_the_approvers_comment(tmp_path: Path, mode: str,
                                                                   answers: str) -> None:
    bank = Bank()
    async with gateway(tmp_path, bank, json=answers == "json") as stack, \
            Client(f"{stack.gateway_url}/mcp/up", mode=mode) as client:
        deciding = asyncio.create_task(decide_when_asked(stack, False, "not on a Friday"))
        refused = await client.call_tool("transfer", {"amount": 987_654_321, "to": "bob"})
        await deciding
    assert refused.is_error and refused.structured_content is not None
    assert refused.structured_content["code"] == "gateway.approval.denied"
    assert refused.structured_content["retryable"] is False
    assert "not on a Friday" in refused.content[0].text and "alice" in refused.content[0].text
    assert "987654321" not in orjson.dumps(refused.structured_content).decode()
    assert bank.calls == []  # never reached the upstream
    call = [r for r in records(stack) if r["method"] == "tools/call"][-1]
    assert call["status"] == "denied"
    assert call["denied_reason"] == "approval denied by alice: not on a Friday"
    assert call["policy"]["approval"]["decision"] == "denied"
    assert "987654321" not in repr(call)


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
async def test_undecided_then_approved_the_retry_runs_once(tmp_path: Path, mode: str) -> None:
    bank = Bank()
    args = {"amount": 5, "to": "carol"}
    async with gateway(tmp_path, bank, config=rules(wait_s=0.3)) as stack, \
            Client(f"{stack.gateway_url}/mcp/up", mode=mode) as client:
        first = await client.call_tool("transfer", args)
        assert first.is_error and first.structured_content is not None
        details = first.structured_content["details"]
        assert first.structured_content["code"] == "gateway.approval.pending"
        assert first.structured_content["retryable"] is True
        assert first.structured_content["retry_after_ms"] > 0
        assert details["approval_url"].endswith(f"/console/approvals/{details['approval_id']}")
        again = await client.call_tool("transfer", args)  # the same call: the same approval
        assert again.structured_content["details"]["approval_id"] == details["approval_id"]
        kind, _ = await approvals(stack).decide(details["approval_id"], True, SRE, "")
        assert kind == "decided"
        changed = await client.call_tool("transfer", {"amount": 6, "to": "carol"})
        ran = await client.call_tool("transfer", args)
        once_more = await client.call_tool("transfer", args)  # single use
    assert changed.is_error and changed.structured_content["code"] == "gateway.approval.pending"
    assert changed.structured_content["details"]["approval_id"] != details["approval_id"]
    assert not ran.is_error and ran.content[0].text == "sent 5 to carol"
    assert once_more.structured_content["code"] == "gateway.approval.pending"
    assert once_more.structured_content["details"]["approval_id"] != details["approval_id"]
    assert bank.calls == [("transfer", args)]
    calls = [r for r in records(stack) if r["method"] == "tools/call"]
    assert [r["status"] for r in calls] == ["denied", "denied", "denied", "ok", "denied"]
    assert calls[0]["denied_reason"].startswith(f"approval pending: {details['approval_id']}")
    assert calls[3]["policy"]["approval"]["id"] == details["approval_id"]


@pytest.mark.parametrize("answers", ["sse", "json"])
async def test_a_held_call_counts_once_against_the_rate_limits(tmp_path: Path,
                                                               answers: str) -> None:
    """The chain runs again once a held call is approved (to use the grant up); the rate
    limits counted the call when it was held and do not count it a second time."""
    bank = Bank()
    config = {**rules(), "rate_limits": [{"name": "calls", "rate": "2/h", "key": "principal"}]}
    async with gateway(tmp_path, bank, json=answers == "json", config=config) as stack, \
            Client(f"{stack.gateway_url}/mcp/up") as client:
        deciding = asyncio.create_task(decide_when_asked(stack, True))
        sent = await client.call_tool("transfer", {"amount": 1, "to": "bob"})
        await deciding
        second = await client.call_tool("balance", {})  # the second call of the two allowed
        with pytest.raises(MCPError) as third:
            await client.call_tool("balance", {})
    assert not sent.is_error and not second.is_error and second.content[0].text == "42"
    assert third.value.error.message == "Too many requests"
    assert bank.calls == [("transfer", {"amount": 1, "to": "bob"}), ("balance", {})]
