"""`approvers = ["self"]`: the caller confirms their own call. A 2025-11-25 client that declared
elicitation is asked with `elicitation/create` on the held call's stream; a 2026-07-28 one gets
an `input_required` answer and resubmits the call with its response; accept runs the call,
decline refuses it, through the official SDK client's elicitation callback, the upstream an
official-SDK server (SSE or JSON). A client that declared neither gets the pending result with
the approval's console URL, and a person other than the caller cannot confirm it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from mcp_types import ElicitResult

from policies.approvals import arguments_digest
from proxy.approvals import Approver
from tests.approvals.test_gateway import approvals, gateway, records, rules
from tests.policies.cedar.test_gateway import Bank

SELF = rules(approvers=["self"])


@pytest.mark.parametrize("answers", ["sse", "json"])
@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
@pytest.mark.parametrize("action", ["accept", "decline"])
async def test_the_caller_confirms_through_elicitation(tmp_path: Path, mode: str,
                                                       answers: str, action: str) -> None:
    bank, asked = Bank(), []

    async def on_elicit(context: Any, params: Any) -> ElicitResult:
        asked.append(params.message)
        return ElicitResult(action=action)

    async with gateway(tmp_path, bank, json=answers == "json", config=SELF) as stack, \
            Client(f"{stack.gateway_url}/mcp/up", mode=mode,
                   elicitation_callback=on_elicit) as client:
        result = await client.call_tool("transfer", {"amount": 3, "to": "me"})
    (message,) = asked
    assert "transfer" in message and arguments_digest({"amount": 3, "to": "me"}) in message
    calls = [r for r in records(stack) if r["method"] == "tools/call"]
    decisions = [r for r in records(stack) if r["method"].startswith("approvals/")]
    if action == "accept":
        assert not result.is_error and result.content[0].text == "sent 3 to me"
        assert bank.calls == [("transfer", {"amount": 3, "to": "me"})]
        assert [d["method"] for d in decisions] == ["approvals/approve"]
        assert calls[-1]["status"] == "ok"
        assert calls[-1]["policy"]["approval"]["decision"] == "approved"
    else:
        assert result.is_error and result.structured_content is not None
        assert result.structured_content["code"] == "gateway.approval.denied"
        assert "declined by the caller" in result.content[0].text
        assert bank.calls == []
        assert [d["method"] for d in decisions] == ["approvals/deny"]
        assert calls[-1]["status"] == "denied"
    assert decisions[0]["note"] in ("confirmed by the caller", "declined by the caller")


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
async def test_a_client_without_elicitation_gets_the_link(tmp_path: Path, mode: str) -> None:
    bank = Bank()
    async with gateway(tmp_path, bank, config=rules(wait_s=0.2, approvers=["self"])) as stack, \
            Client(f"{stack.gateway_url}/mcp/up", mode=mode) as client:
        first = await client.call_tool("transfer", {"amount": 4, "to": "me"})
        details = first.structured_content["details"]
        assert first.structured_content["code"] == "gateway.approval.pending"
        assert details["approval_url"].endswith(f"/console/approvals/{details['approval_id']}")
        held = approvals(stack)
        someone = Approver("mallory", frozenset({"sre"}), issuer="elsewhere")
        assert (await held.decide(details["approval_id"], True, someone, ""))[0] == "forbidden"
        caller = await held.store.get(details["approval_id"])
        assert caller is not None
        issuer, _, subject = caller.caller.partition("|")
        me = Approver(subject, issuer=issuer)  # the caller, signed in as themselves
        assert (await held.decide(details["approval_id"], True, me, ""))[0] == "decided"
        again = await client.call_tool("transfer", {"amount": 4, "to": "me"})
    assert not again.is_error and bank.calls == [("transfer", {"amount": 4, "to": "me"})]
