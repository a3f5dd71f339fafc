"""Held calls at the edges, through the real gateway (an official-SDK upstream, endpoint `up`):

* a 2025-11-25 client that does not take SSE. One whose Accept names JSON alone is refused
  406 at the edge, as every request of it (the transport requires both media types:
  docs/errors.md), before any policy: no approval is asked. One that sends no Accept (or
  `*/*`) gets its held call as a long JSON request: it waits up to `wait_s`, then answers as
  usual (run once approved, pending when undecided).
* a client that goes away while its call waits: the approval stays pending, the abandoned
  request never reaches the upstream, and the same call retried after the approval runs once.
* `expires_s` with the wall clock injected (`create_app(wall_clock=...)`, the memory store):
  a grant not used before it expires is void, the retry is held again, and the expiry is
  audited once.
* a virtual endpoint: a rule on a member's tool holds the call made through the virtual
  endpoint (the gate decides with the member's context: endpoint `up`, its own tool name).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from mcp import Client

from tests import db_backends
from tests.approvals.test_gateway import (
    SRE,
    approvals,
    decide_when_asked,
    gateway,
    pending,
    records,
    rules,
)
from tests.e2e.conftest import Stack, stack_config
from tests.e2e.upstreams import UpstreamProbe
from tests.policies.cedar.test_gateway import Bank
from tests.stack import gateway_stack

VERSION = "2025-11-25"
ARGS = {"amount": 3, "to": "dan"}


def rpc(msg_id: int, method: str, **params: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": msg_id, "method": method, "params": params}


class Raw:
    """A raw 2025-11-25 client on httpx: `accept` is its Accept header (None: none sent)."""

    def __init__(self, http: httpx.AsyncClient, url: str, accept: str | None) -> None:
        self.http, self.url = http, url
        self.headers = {"Content-Type": "application/json"}
        if accept is not None:
            self.headers["Accept"] = accept
        else:
            http.headers.pop("accept", None)  # httpx's default (*/*): none at all

    async def post(self, body: dict[str, Any]) -> httpx.Response:
        return await self.http.post(self.url, content=orjson.dumps(body), headers=self.headers)

    async def initialize(self) -> httpx.Response:
        opened = await self.post(rpc(0, "initialize", protocolVersion=VERSION, capabilities={},
                                     clientInfo={"name": "raw", "version": "1"}))
        if opened.status_code == 200:
            self.headers["MCP-Protocol-Version"] = VERSION
            if (sid := opened.headers.get("mcp-session-id")) is not None:
                self.headers["Mcp-Session-Id"] = sid
            done = await self.post({"jsonrpc": "2.0", "method": "notifications/initialized"})
            assert done.status_code == 202, done.text
        return opened

    async def call(self, msg_id: int, arguments: dict[str, Any] | None = None
                   ) -> httpx.Response:
        return await self.post(rpc(msg_id, "tools/call", name="transfer",
                                   arguments=arguments or ARGS))


def message(answer: httpx.Response) -> Any:
    """The JSON-RPC answer of a JSON body, or of an SSE stream's last data event."""
    if answer.headers["content-type"].startswith("application/json"):
        return answer.json()
    return orjson.loads([line[5:] for line in answer.text.splitlines()
                         if line.startswith("data:") and line[5:].strip()][-1])


async def records_until(stack: Stack, match: Callable[[dict[str, Any]], bool], what: str
                        ) -> list[dict[str, Any]]:
    """The call records, once one matches (the audit sink writes them a moment later)."""
    deadline = time.monotonic() + 10
    while True:
        rows = records(stack)
        if any(match(r) for r in rows):
            return rows
        assert time.monotonic() < deadline, f"no audit record of {what}"
        await asyncio.sleep(0.02)


# -- a client that takes JSON only ----------------------------------------------------------


async def test_an_accept_of_json_alone_is_refused_before_any_approval(tmp_path: Path) -> None:
    """Why a JSON-only client was never asked: the edge answers 406 to its every request."""
    bank = Bank()
    async with gateway(tmp_path, bank) as stack, httpx.AsyncClient(timeout=30) as http:
        raw = Raw(http, stack.endpoint, "application/json")
        opened = await raw.initialize()
        called = await raw.call(1)
        asked = await approvals(stack).store.pending()
    for answer in (opened, called):
        assert answer.status_code == 406
        assert answer.json()["error"]["code"] == -32600
        assert "text/event-stream" in answer.json()["error"]["message"]
    assert asked == [] and bank.calls == []


@pytest.mark.parametrize("accept", [None, "*/*"])
async def test_a_client_without_sse_waits_on_a_long_request(tmp_path: Path,
                                                            accept: str | None) -> None:
    bank = Bank()
    async with gateway(tmp_path, bank) as stack, httpx.AsyncClient(timeout=30) as http:
        raw = Raw(http, stack.endpoint, accept)
        assert (await raw.initialize()).status_code == 200
        unheld = await raw.post(rpc(1, "tools/call", name="balance", arguments={}))
        deciding = asyncio.create_task(decide_when_asked(stack, True, "fine"))
        answer = await raw.call(2)
        approval = await deciding
    assert answer.status_code == 200 == unheld.status_code
    # answered as a call no rule holds is (the upstream's SSE relayed, as to any such client)
    assert answer.headers["content-type"] == unheld.headers["content-type"]
    result = message(answer)["result"]
    assert not result.get("isError") and result["content"][0]["text"] == "sent 3 to dan"
    assert bank.calls == [("balance", {}), ("transfer", ARGS)]
    call = [r for r in records(stack) if r["method"] == "tools/call"][-1]
    assert call["status"] == "ok" and call["policy"]["approval"]["id"] == approval.id


async def test_a_client_without_sse_gets_the_pending_result_after_wait_s(
        tmp_path: Path) -> None:
    bank = Bank()
    async with gateway(tmp_path, bank, config=rules(wait_s=0.3)) as stack, \
            httpx.AsyncClient(timeout=30) as http:
        raw = Raw(http, stack.endpoint, None)
        assert (await raw.initialize()).status_code == 200
        answer = await raw.call(1)
        (approval,) = await approvals(stack).store.pending()
    assert answer.status_code == 200
    assert answer.headers["content-type"].startswith("application/json")
    result = answer.json()["result"]
    assert result["isError"] is True
    assert result["structuredContent"]["code"] == "gateway.approval.pending"
    assert result["structuredContent"]["details"]["approval_id"] == approval.id
    assert bank.calls == []


# -- a client that goes away while it waits --------------------------------------------------


@pytest.mark.parametrize("accept", ["application/json, text/event-stream", None])
async def test_a_client_gone_while_waiting_leaves_the_approval_for_its_retry(
        tmp_path: Path, accept: str | None) -> None:
    bank = Bank()  # (wait_s: what the last call, held again, waits before its answer)
    async with gateway(tmp_path, bank, config=rules(wait_s=3.0)) as stack, \
            httpx.AsyncClient(timeout=30) as http:
        raw = Raw(http, stack.endpoint, accept)
        assert (await raw.initialize()).status_code == 200
        abandoned = asyncio.create_task(raw.call(1))
        (approval,) = await pending(stack)
        abandoned.cancel()  # the connection closes while the call waits
        await asyncio.gather(abandoned, return_exceptions=True)
        await records_until(stack, lambda r: r["method"] == "tools/call"
                            and r["status"] == "cancelled", "the abandoned call")
        assert (await approvals(stack).store.get(approval.id)).status == "pending"  # type: ignore[union-attr]
        kind, _ = await approvals(stack).decide(approval.id, True, SRE, "")
        assert kind == "decided"
        retried = await raw.call(2)
        again = await raw.call(3)  # single use: the retry used it up
    assert retried.status_code == 200
    assert message(retried)["result"]["content"][0]["text"] == "sent 3 to dan"
    assert bank.calls == [("transfer", ARGS)]  # once: nothing from the abandoned request
    assert again.status_code == 200 and "gateway.approval.pending" in again.text
    calls = [r for r in records(stack) if r["method"] == "tools/call"]
    assert [r["status"] for r in calls] == ["cancelled", "ok", "denied"]
    assert calls[1]["policy"]["approval"]["id"] == approval.id


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
async def test_an_sdk_client_that_gives_up_leaves_the_approval(tmp_path: Path,
                                                               mode: str) -> None:
    """The official SDK client's call cancelled while it waits (its request closed, or
    cancelled by notice): the call's record is `cancelled`, nothing runs, the retry after
    the approval runs once."""
    bank = Bank()
    async with gateway(tmp_path, bank, config=rules(wait_s=3.0)) as stack, \
            Client(f"{stack.gateway_url}/mcp/up", mode=mode) as client:
        waiting = asyncio.create_task(client.call_tool("transfer", ARGS))
        (approval,) = await pending(stack)
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)
        await records_until(stack, lambda r: r["method"] == "tools/call"
                            and r["status"] == "cancelled", "the abandoned call")
        assert (await approvals(stack).store.get(approval.id)).status == "pending"  # type: ignore[union-attr]
        kind, _ = await approvals(stack).decide(approval.id, True, SRE, "")
        assert kind == "decided" and bank.calls == []
        ran = await client.call_tool("transfer", ARGS)
    assert not ran.is_error and ran.content[0].text == "sent 3 to dan"
    assert bank.calls == [("transfer", ARGS)]
    calls = [r for r in records(stack) if r["method"] == "tools/call"]
    assert [r["status"] for r in calls] == ["cancelled", "ok"]


@pytest.mark.parametrize("accept", ["application/json, text/event-stream", None])
async def test_a_cancelled_held_call_never_runs_and_leaves_the_approval(
        tmp_path: Path, accept: str | None) -> None:
    """The client's notifications/cancelled ends the wait (-32800), as it ends a call in
    flight: an approval given afterwards runs nothing until the same call is sent again."""
    bank = Bank()
    async with gateway(tmp_path, bank) as stack, httpx.AsyncClient(timeout=30) as http:
        raw = Raw(http, stack.endpoint, accept)
        assert (await raw.initialize()).status_code == 200
        waiting = asyncio.create_task(raw.call(1))
        (approval,) = await pending(stack)
        notice = await raw.post({"jsonrpc": "2.0", "method": "notifications/cancelled",
                                 "params": {"requestId": 1, "reason": "changed my mind"}})
        assert notice.status_code == 202
        cancelled = await asyncio.wait_for(waiting, 10)  # long before wait_s (30 s)
        assert (await approvals(stack).store.get(approval.id)).status == "pending"  # type: ignore[union-attr]
        kind, _ = await approvals(stack).decide(approval.id, True, SRE, "")
        assert kind == "decided" and bank.calls == []  # the cancelled call did not go on
        retried = await raw.call(2)
    assert message(cancelled)["error"]["code"] == -32800
    assert message(retried)["result"]["content"][0]["text"] == "sent 3 to dan"
    assert bank.calls == [("transfer", ARGS)]
    calls = [r for r in records(stack) if r["method"] == "tools/call"]
    assert [r["status"] for r in calls] == ["cancelled", "ok"]


# -- expires_s, on an injected clock ---------------------------------------------------------


@asynccontextmanager
async def clocked(tmp_path: Path, bank: Bank, now: list[float], **rule: Any
                  ) -> AsyncIterator[Stack]:
    """The gateway with its wall clock at `now[0]` (the memory store: Redis keeps its own)."""
    db = db_backends.url()
    config = {**rules(**rule), "state": {"url": "memory"}}
    async with gateway_stack(lambda urls: stack_config(urls.upstream, db, config,
                                                       screening={"mode": "off"}),
                             upstream=bank.app(), wall_clock=lambda: now[0]) as site:
        yield Stack(site.upstream, site.url, UpstreamProbe(), site.services, db)


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
async def test_a_grant_not_used_before_expires_s_is_void(tmp_path: Path, mode: str) -> None:
    bank, now = Bank(), [1_000_000.0]
    async with clocked(tmp_path, bank, now, wait_s=0.2, expires_s=600) as stack, \
            Client(f"{stack.gateway_url}/mcp/up", mode=mode) as client:
        first = await client.call_tool("transfer", ARGS)
        granted = first.structured_content["details"]["approval_id"]  # type: ignore[index]
        kind, _ = await approvals(stack).decide(granted, True, SRE, "")
        assert kind == "decided"
        now[0] += 599  # still usable: not used, nothing swept
        assert await approvals(stack).sweep() == 0
        now[0] += 2  # past expires_s since it was granted: void
        retried = await client.call_tool("transfer", ARGS)
        swept = [await approvals(stack).sweep(), await approvals(stack).sweep()]
        late = await approvals(stack).decide(granted, True, SRE, "")
        gone = await approvals(stack).store.get(granted)
    assert retried.is_error and retried.structured_content is not None
    assert retried.structured_content["code"] == "gateway.approval.pending"
    assert retried.structured_content["details"]["approval_id"] != granted  # held again
    assert bank.calls == []
    assert swept == [1, 0] and late[0] == "expired"
    assert gone is not None and gone.status == "expired"
    expiries = [r for r in records(stack) if r["method"] == "approvals/expire"]
    assert len(expiries) == 1 and expiries[0]["policy"]["approval"]["id"] == granted


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
async def test_a_grant_used_in_time_runs_once_on_the_clock(tmp_path: Path, mode: str) -> None:
    """The other side of the bound: one second before expires_s the grant still runs."""
    bank, now = Bank(), [1_000_000.0]
    async with clocked(tmp_path, bank, now, wait_s=0.2, expires_s=600) as stack, \
            Client(f"{stack.gateway_url}/mcp/up", mode=mode) as client:
        first = await client.call_tool("transfer", ARGS)
        granted = first.structured_content["details"]["approval_id"]  # type: ignore[index]
        await approvals(stack).decide(granted, True, SRE, "")
        now[0] += 599
        ran = await client.call_tool("transfer", ARGS)
        now[0] += 2
        swept = await approvals(stack).sweep()
    assert not ran.is_error and bank.calls == [("transfer", ARGS)]
    assert swept == 0  # used: nothing left to expire, nothing audited
    assert not [r for r in records(stack) if r["method"] == "approvals/expire"]


# -- a virtual endpoint ----------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
async def test_a_rule_on_a_members_tool_holds_the_call_through_a_virtual_endpoint(
        tmp_path: Path, mode: str) -> None:
    bank = Bank()
    config = {**rules(), "endpoints": [{"name": "v", "members": ["up"]}]}
    async with gateway(tmp_path, bank, config=config) as stack, \
            Client(f"{stack.gateway_url}/mcp/v", mode=mode) as client:
        deciding = asyncio.create_task(decide_when_asked(stack, True))
        sent = await client.call_tool("up__transfer", ARGS)
        approval = await deciding
        balance = await client.call_tool("up__balance", {})  # no rule: not held
    assert approval.endpoint == "up" and approval.tool == "transfer"
    assert not sent.is_error and sent.content[0].text == "sent 3 to dan"
    assert not balance.is_error
    assert bank.calls == [("transfer", ARGS), ("balance", {})]
    calls = [r for r in records(stack) if r["method"] == "tools/call"]
    assert calls[0]["policy"]["approval"]["id"] == approval.id


async def test_a_denial_through_a_virtual_endpoint_never_reaches_the_member(
        tmp_path: Path) -> None:
    bank = Bank()
    config = {**rules(), "endpoints": [{"name": "v", "members": ["up"]}]}
    async with gateway(tmp_path, bank, config=config) as stack, \
            Client(f"{stack.gateway_url}/mcp/v") as client:
        deciding = asyncio.create_task(decide_when_asked(stack, False, "no"))
        refused = await client.call_tool("up__transfer", ARGS)
        await deciding
    assert refused.is_error and refused.structured_content is not None
    assert refused.structured_content["code"] == "gateway.approval.denied"
    assert bank.calls == []
