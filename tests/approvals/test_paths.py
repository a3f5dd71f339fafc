"""Paths of a held call through the real gateway beside the main ones: the progress notice a
client that sent a progress token gets while it waits (with the approval's link), and the bound on a caller's pending approvals
reached through HTTP (`gateway.approval.too_many`, asking no one)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from mcp import Client

from policies.approvals import MAX_PENDING
from tests.approvals.test_gateway import approvals, decide_when_asked, gateway, rules
from tests.policies.cedar.test_gateway import Bank


async def test_a_progress_token_gets_the_awaiting_notice(tmp_path: Path) -> None:
    bank, notices = Bank(), []

    async def progress(value: float, total: float | None, message: str | None) -> None:
        notices.append(message)

    async with gateway(tmp_path, bank) as stack, \
            Client(f"{stack.gateway_url}/mcp/up") as client:
        deciding = asyncio.create_task(decide_when_asked(stack, True))
        sent = await client.call_tool("transfer", {"amount": 2, "to": "x"},
                                      progress_callback=progress)
        approval = await deciding
    assert not sent.is_error
    assert notices == [(f"awaiting approval {approval.id} (transfers): "
                       f"{approvals(stack).link(approval.id)}")]


async def test_a_flood_of_pending_approvals_is_bounded(tmp_path: Path) -> None:
    bank = Bank()
    async with gateway(tmp_path, bank, config=rules(wait_s=0.01)) as stack, \
            Client(f"{stack.gateway_url}/mcp/up") as client:
        codes = [(await client.call_tool("transfer", {"amount": n, "to": "z"}))
                 .structured_content["code"] for n in range(MAX_PENDING + 3)]
        pending = await approvals(stack).store.pending()
    assert codes == ["gateway.approval.pending"] * MAX_PENDING + \
        ["gateway.approval.too_many"] * 3
    assert len(pending) == MAX_PENDING and bank.calls == []
