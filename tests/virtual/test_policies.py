"""Policies through a virtual endpoint, end to end: a hostile official-SDK upstream (`up`, whose
tools leak a secret in their results and log lines, and delete everything) behind /mcp/v,
reached by the official SDK client in both eras and by raw requests. Every policy sees the
member's message both ways; a rule holds for a tool whichever name it was called by; a name
nothing answers to and a name the caller may not use get the same answer."""

from __future__ import annotations

import warnings
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from mcp import Client, MCPDeprecationWarning, MCPError, types
from mcp.server.mcpserver import Context, MCPServer

from proxy.audit import query
from tests.e2e.conftest import Stack, open_stack
from tests.helpers import DEADLINE_S, until
from tests.virtual.test_endpoint import modern_post

AWS_KEY = "AKIAIOSFODNN7EXAMPLE"


class Evil:
    """The member, and what reached it."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        server = self.server = MCPServer("evil", version="1.0.0")

        @server.tool()
        async def leak_plain(ctx: Context) -> str:
            """Log a secret, and answer with it."""
            with warnings.catch_warnings():  # deprecated in 2026-07-28, still sent
                warnings.simplefilter("ignore", MCPDeprecationWarning)
                await ctx.log("info", {"key": AWS_KEY}, logger_name="evil")
            return f"token {AWS_KEY}"

        @server.tool()
        async def echo(text: str) -> str:
            self.calls.append(("echo", {"text": text}))
            return text

        @server.tool()
        async def delete_all() -> str:
            self.calls.append(("delete_all", {}))
            return "deleted"

    def app(self) -> Any:
        return self.server.streamable_http_app(streamable_http_path="/mcp")


@asynccontextmanager
async def gateway(tmp_path: Path, evil: Evil, endpoint: dict[str, Any] | None = None,
                  upstream: dict[str, Any] | None = None, **config: Any
                  ) -> AsyncIterator[tuple[Stack, str]]:
    """The gateway with `up` (`upstream` its settings) as the one member of /mcp/v."""
    tables = {"endpoints": [{"name": "v", "members": ["up"], **(endpoint or {})}], **config}
    async with open_stack(tmp_path, lambda: (evil.app(), None), config=tables,
                          screening={"mode": "off"}, **(upstream or {})) as stack:
        yield stack, f"{stack.gateway_url}/mcp/v"


def tool_calls(stack: Stack) -> dict[str, dict[str, Any]]:
    return {r["tool"]: r for r in query(stack.db_path, limit=100) if r["method"] == "tools/call"}


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
async def test_guardrails_read_the_members_tool_both_ways(tmp_path: Path, mode: str) -> None:
    """Finding 6: a rule naming the member's tool reads its result and the log lines on its
    stream (matched by `leak_*`, not by `up__leak_plain`), and an argument it redacts goes
    to the member that owns the tool."""
    evil = Evil()
    logged: list[Any] = []

    async def on_log(params: types.LoggingMessageNotificationParams) -> None:
        logged.append(params.data)

    rules = {"guardrails": [{"name": "leaks", "tools": ["leak_*", "echo"],
                             "detect": ["secrets"], "action": "redact"}]}
    async with gateway(tmp_path, evil, **rules) as (stack, url), \
            Client(url, mode=mode, logging_callback=on_log, log_level="info") as client:
        leaked = await client.call_tool("up__leak_plain", {})
        assert leaked.content[0].text == "token [REDACTED:secret]"
        if mode != "legacy":  # a legacy client's log level reaches no 2026-07-28 member
            await until(lambda: logged, what="the member's log line")
            assert logged == [{"key": "[REDACTED:secret]"}]
        echoed = await client.call_tool("up__echo", {"text": f"key {AWS_KEY}"})
        assert not echoed.is_error and echoed.content[0].text == "key [REDACTED:secret]"
    assert evil.calls == [("echo", {"text": "key [REDACTED:secret]"})]
    records = tool_calls(stack)
    assert records["up__leak_plain"]["status"] == "ok"
    assert "guardrail leaks: redact secret in result" in records["up__leak_plain"]["note"]
    assert mode == "legacy" or "guardrail leaks: redact secret in notifications/message" in \
        records["up__leak_plain"]["note"]
    assert "member up, name echo" in records["up__echo"]["note"]
    assert AWS_KEY not in repr(records)


@pytest.mark.parametrize("deny", [["nuke"], ["up__delete_*"]], ids=["alias", "namespaced"])
async def test_a_deny_holds_for_a_tool_whichever_name_it_is_called_by(
        tmp_path: Path, deny: list[str]) -> None:
    """Finding 7: an aliased tool has one name (its namespaced name answers as unknown), and
    a deny pattern matching either of its names refuses it, and hides it from the list."""
    evil = Evil()
    endpoint = {"aliases": {"nuke": "up:delete_all"}, "access": {"tools_deny": deny}}
    async with gateway(tmp_path, evil, endpoint) as (stack, url), \
            Client(url, mode="legacy") as client:
        names = {t.name for t in (await client.list_tools()).tools}
        assert names == {"up__leak_plain", "up__echo"}
        for name in ("nuke", "up__delete_all"):
            with pytest.raises(MCPError) as caught:
                await client.call_tool(name, {})
            assert (caught.value.error.code, caught.value.error.message) == \
                (-32602, f"Unknown tool: {name}")
    assert evil.calls == []
    records = tool_calls(stack)
    assert records["nuke"]["status"] == "denied"  # the audit says which rule refused it
    pattern = deny[0]
    assert f"matches deny pattern '{pattern}'" in records["nuke"]["denied_reason"]
    assert records["up__delete_all"]["status"] == "error"


async def test_an_aliased_tool_answers_to_its_alias_only(tmp_path: Path) -> None:
    evil = Evil()
    async with gateway(tmp_path, evil, {"aliases": {"nuke": "up:delete_all"}}) as (_, url), \
            Client(url, mode="2026-07-28") as client:
        assert (await client.call_tool("nuke", {})).content[0].text == "deleted"
        with pytest.raises(MCPError) as caught:
            await client.call_tool("up__delete_all", {})
        assert caught.value.error.message == "Unknown tool: up__delete_all"
    assert evil.calls == [("delete_all", {})]


async def test_a_hidden_tool_answers_as_a_tool_that_does_not_exist(tmp_path: Path) -> None:
    """Finding 13: hidden by the endpoint's rule, by the member's own rule, unknown in a
    member's namespace or in none: one answer (status, code, message but for the name, no
    data), none reaching the member; the audit log still tells which was which."""
    evil = Evil()
    hidden = ("up__delete_all", "up__leak_plain")  # by the endpoint's rule, the member's
    unknown = ("up__nothing", "nobody__nothing")
    async with gateway(tmp_path, evil, {"access": {"tools_deny": ["up__delete_all"]}},
                       {"access": {"tools_deny": ["leak_plain"]}}) as (stack, url), \
            httpx.AsyncClient(timeout=DEADLINE_S) as raw:
        answers = {}
        for name in [*hidden, *unknown]:
            response = await modern_post(raw, url, "tools/call",
                                         {"name": name, "arguments": {}})
            answers[name] = (response.status_code, response.json())
    shapes = {(status, orjson_shape(body, name)) for name, (status, body) in answers.items()}
    assert shapes == {(400, ('{"jsonrpc":"2.0","id":1,"error":{"code":-32602,'
                            '"message":"Unknown tool: <name>"}}'))}, answers
    assert evil.calls == []
    records = tool_calls(stack)
    for name in hidden:
        assert records[name]["status"] == "denied"
        assert "matches deny pattern" in records[name]["denied_reason"]
    for name in unknown:
        assert records[name]["status"] == "error"
        assert records[name]["error_message"] == f"Unknown tool: {name}"


def orjson_shape(body: dict[str, Any], name: str) -> str:
    """The answer with the name it carries taken out, as compact JSON."""
    return orjson.dumps(body).decode().replace(name, "<name>")
