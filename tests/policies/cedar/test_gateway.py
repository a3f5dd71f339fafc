"""Cedar policies through the real gateway: an official-SDK upstream with a read-only tool, a
destructive one taking arguments and one no policy permits, behind a plain endpoint and a
virtual one, reached by the official SDK client in both eras. What a policy permits goes
through; a call refused for its arguments answers seed 001's tool result; a tool no call of
which could be permitted is neither listed nor callable (it answers as an unknown tool); shadow
mode refuses nothing and audits what it would have refused."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from mcp import Client, MCPError
from mcp.server.mcpserver import MCPServer
from mcp.types import ToolAnnotations

from proxy.audit import query
from tests.e2e.conftest import Stack, open_stack
from tests.e2e.sdk_client import connect
from tests.e2e.test_eras import modern_request
from tests.stdio.conftest import stdio_gateway, stdio_upstream

POLICIES = """
@id("read-anything")
permit(principal, action == Tollhouse::Action::"tools/call", resource)
when { resource has readOnlyHint && resource.readOnlyHint };

@id("small-transfers")
permit(principal, action == Tollhouse::Action::"tools/call",
       resource == Tollhouse::Tool::"up/transfer")
when { context.input.amount < 500 };

@id("never-mallory")
@reason("transfers to mallory are not allowed")
forbid(principal, action == Tollhouse::Action::"tools/call",
       resource == Tollhouse::Tool::"up/transfer")
when { context.input.to == "mallory" };
"""


class Bank:
    """The upstream, and what reached it."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        server = self.server = MCPServer("bank", version="1.0.0")

        @server.tool(annotations=ToolAnnotations(readOnlyHint=True))
        async def balance() -> str:
            self.calls.append(("balance", {}))
            return "42"

        @server.tool(annotations=ToolAnnotations(destructiveHint=True))
        async def transfer(amount: int, to: str) -> str:
            self.calls.append(("transfer", {"amount": amount, "to": to}))
            return f"sent {amount} to {to}"

        @server.tool()
        async def wipe() -> str:
            self.calls.append(("wipe", {}))
            return "wiped"

    def app(self, json: bool = False) -> Any:
        """SSE answers on sessions, or (`json`) stateless JSON ones."""
        return self.server.streamable_http_app(streamable_http_path="/mcp", json_response=json,
                                               stateless_http=json)


@asynccontextmanager
async def gateway(tmp_path: Path, bank: Bank, mode: str = "enforce",
                  text: str = POLICIES, json: bool = False) -> AsyncIterator[Stack]:
    (tmp_path / "bank.cedar").write_text(text)
    config = {"policy": {"files": [str(tmp_path / "*.cedar")], "mode": mode},
              "endpoints": [{"name": "v", "members": ["up"]}]}
    async with open_stack(tmp_path, lambda: (bank.app(json), None), config=config,
                          screening={"mode": "off"}) as stack:
        yield stack


def decided(stack: Stack) -> list[dict[str, Any]]:
    """The tools/call records, oldest first, each with its policy object parsed."""
    rows = [r for r in query(stack.db_path, limit=100) if r["method"] == "tools/call"]
    for row in rows:
        row["policy"] = orjson.loads(row["policy"]) if row["policy"] else None
    return rows[::-1]


@pytest.mark.parametrize("answers", ["sse", "json"])
@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
async def test_policies_decide_on_the_call_itself(tmp_path: Path, mode: str, answers: str
                                                  ) -> None:
    bank = Bank()
    async with gateway(tmp_path, bank, json=answers == "json") as stack, \
            Client(f"{stack.gateway_url}/mcp/up", mode=mode) as client:
        names = {t.name for t in (await client.list_tools()).tools}
        assert names == {"balance", "transfer"}  # no call of wipe could be permitted
        assert (await client.call_tool("balance", {})).content[0].text == "42"
        sent = await client.call_tool("transfer", {"amount": 100, "to": "bob"})
        assert not sent.is_error and sent.content[0].text == "sent 100 to bob"
        big = await client.call_tool("transfer", {"amount": 987_654_321, "to": "bob"})
        to_mallory = await client.call_tool("transfer", {"amount": 5, "to": "mallory"})
        with pytest.raises(MCPError) as unknown:
            await client.call_tool("wipe", {})
    assert big.is_error and big.structured_content is not None
    assert big.structured_content["code"] == "gateway.policy.denied"
    assert big.structured_content["retryable"] is False
    assert big.structured_content["message"] == "no policy permits this call"
    assert to_mallory.is_error and to_mallory.structured_content is not None
    assert to_mallory.structured_content["message"] == "transfers to mallory are not allowed"
    assert "987654321" not in big.content[0].text
    assert unknown.value.error.code == -32602 and "wipe" in unknown.value.error.message
    assert bank.calls == [("balance", {}), ("transfer", {"amount": 100, "to": "bob"})]
    records = decided(stack)
    assert [(r["tool"], r["status"]) for r in records] == [
        ("balance", "ok"), ("transfer", "ok"), ("transfer", "denied"), ("transfer", "denied"),
        ("wipe", "denied")]
    assert [r["policy"]["decision"] for r in records] == ["allow"] * 2 + ["deny"] * 3
    assert records[0]["policy"]["policies"] == ["read-anything"]
    assert records[1]["policy"]["policies"] == ["small-transfers"]
    assert records[3]["policy"]["policies"] == ["never-mallory"]
    assert records[3]["denied_reason"] == "cedar: forbidden by never-mallory"
    assert len({r["policy"]["version"] for r in records}) == 1
    # an argument's value is never audited (in what a record says of the call)
    assert not any("987654321" in repr([r["denied_reason"], r["error_message"], r["note"],
                                        r["policy"]]) for r in records)


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
async def test_a_virtual_endpoint_decides_by_the_members_tool(tmp_path: Path, mode: str
                                                              ) -> None:
    bank = Bank()
    async with gateway(tmp_path, bank) as stack, \
            Client(f"{stack.gateway_url}/mcp/v", mode=mode) as client:
        names = {t.name for t in (await client.list_tools()).tools}
        assert names == {"up__balance", "up__transfer"}
        sent = await client.call_tool("up__transfer", {"amount": 10, "to": "bob"})
        big = await client.call_tool("up__transfer", {"amount": 10_000, "to": "bob"})
        with pytest.raises(MCPError) as unknown:
            await client.call_tool("up__wipe", {})
    assert not sent.is_error
    assert big.is_error and big.structured_content is not None
    assert big.structured_content["code"] == "gateway.policy.denied"
    assert unknown.value.error.code == -32602
    assert bank.calls == [("transfer", {"amount": 10, "to": "bob"})]


async def test_shadow_mode_refuses_nothing_and_audits_what_it_would_have(
        tmp_path: Path) -> None:
    bank = Bank()
    async with gateway(tmp_path, bank, mode="shadow") as stack, \
            Client(f"{stack.gateway_url}/mcp/up", mode="legacy") as client:
        names = {t.name for t in (await client.list_tools()).tools}
        assert names == {"balance", "transfer", "wipe"}  # shadow never hides
        big = await client.call_tool("transfer", {"amount": 900, "to": "mallory"})
        wiped = await client.call_tool("wipe", {})
    assert not big.is_error and not wiped.is_error
    records = decided(stack)
    assert [r["status"] for r in records] == ["ok", "ok"]
    assert records[0]["policy"]["decision"] == "allow"
    assert records[0]["policy"]["shadow"] == "deny"
    assert records[0]["policy"]["shadow_policies"] == ["never-mallory"]
    assert records[1]["policy"]["shadow"] == "deny"
    assert records[1]["policy"]["shadow_policies"] == []  # no permit: none named


async def test_a_policy_naming_an_attribute_that_does_not_exist_stops_start_up(
        tmp_path: Path) -> None:
    bank = Bank()
    bad = 'permit(principal, action, resource) when { principal.departmnet == "x" };'
    with pytest.raises(Exception) as caught:
        async with gateway(tmp_path, bank, text=bad):
            pass
    assert "departmnet" in str(caught.value) and "bank.cedar" in str(caught.value)


async def test_a_stdio_endpoint_is_decided_like_any_other(tmp_path: Path) -> None:
    """A local process behind the gateway: its echo is permitted, but not for one text."""
    (tmp_path / "local.cedar").write_text('''
@id("short-echo")
permit(principal, action == Tollhouse::Action::"tools/call",
       resource == Tollhouse::Tool::"local/echo")
when { context.input.text != "too long to echo" };
''')
    config = {"upstreams": [stdio_upstream()],
              "policy": {"files": [str(tmp_path / "local.cedar")]}}
    async with stdio_gateway(config) as gw, connect(gw.endpoint("local")) as client:
        names = {t.name for t in (await client.list_tools()).tools}
        assert names == {"echo"}  # no call of any other tool could be permitted
        assert (await client.call_tool("echo", {"text": "hi"})).content[0].text == "hi"
        refused = await client.call_tool("echo", {"text": "too long to echo"})
        with pytest.raises(MCPError) as unknown:
            await client.call_tool("pid", {})
    assert refused.is_error and refused.structured_content is not None
    assert refused.structured_content["code"] == "gateway.policy.denied"
    assert refused.structured_content["message"] == "no policy permits this call"
    assert unknown.value.error.code == -32602


async def test_what_a_list_showed_validates_and_decides_after_a_restart(tmp_path: Path) -> None:
    """The tools as last listed (their argument schemas and hints) are kept in the database:
    after a restart, a policy naming an argument that does not exist stops start-up before any
    list, and a policy on a hint decides before any list."""
    bank = Bank()
    async with gateway(tmp_path, bank) as stack, connect(stack.endpoint) as client:
        assert {t.name for t in (await client.list_tools()).tools} == {"balance", "transfer"}
    typo = ('permit(principal, action == Tollhouse::Action::"tools/call", '
            'resource == Tollhouse::Tool::"up/transfer") when { context.input.amout < 5 };')
    with pytest.raises(Exception) as caught:
        async with gateway(tmp_path, bank, text=typo):
            pass
    assert "amout" in str(caught.value) and "bank.cedar" in str(caught.value)
    hints = ('permit(principal, action == Tollhouse::Action::"tools/call", resource) '
             'when { resource has readOnlyHint && resource.readOnlyHint };')
    async with gateway(tmp_path, bank, text=hints) as stack, httpx.AsyncClient() as http:
        answers = []
        for name, arguments in (("balance", {}), ("transfer", {"amount": 1, "to": "b"})):
            body, headers = modern_request("tools/call", {"name": name, "arguments": arguments})
            answer = await http.post(stack.endpoint, content=body, headers=headers)
            answers.append(answer.json())
    assert answers[0]["result"]["content"][0]["text"] == "42", answers
    assert answers[1]["error"]["code"] == -32602  # hidden: no call of it could be permitted
    assert [c[0] for c in bank.calls] == ["balance"]
