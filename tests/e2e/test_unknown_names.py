"""Hidden and unknown names on a plain endpoint (issue 36, finding 13): an official-SDK
upstream (JSON or SSE answers) behind /mcp/up with `tools_deny` and `prompts_deny`, reached by
raw requests of both eras and by the official SDK client. A tool or prompt the caller may not
use and one the upstream does not have get the same answer (status and body but for the name),
from the gateway, and neither reaches the upstream; the audit log still tells them apart. A
name the gateway has not seen listed is looked for in a fresh list (at most every 2 s per
caller), so a tool added upstream later is callable."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from mcp import MCPError
from mcp.server.mcpserver import MCPServer

from proxy.audit import query
from tests.e2e.conftest import Stack, open_stack
from tests.e2e.sdk_client import connect
from tests.e2e.upstreams import UpstreamProbe, _recording
from tests.helpers import DEADLINE_S
from tests.virtual.test_endpoint import answer_of, legacy_post, modern_post

ACCESS = {"tools_deny": ["delete_all"], "prompts_deny": ["internal-*"]}
# method, the hidden name, a name the upstream does not have, how both are answered, the rule
CASES = [("tools/call", "delete_all", "nothing_here", "Unknown tool: ",
          "access: tool delete_all matches deny pattern 'delete_all'"),
         ("prompts/get", "internal-plan", "no-such-prompt", "Unknown prompt: ",
          "access: prompt internal-plan matches deny pattern 'internal-*'")]
Send = Callable[[str, dict[str, Any]], Awaitable[httpx.Response]]


class Upstream:
    """The upstream, and the tools and prompts that ran on it."""

    def __init__(self) -> None:
        self.ran: list[str] = []
        server = self.server = MCPServer("plain", version="1.0.0")

        @server.tool()
        async def echo(text: str) -> str:
            self.ran.append("echo")
            return text

        @server.tool()
        async def delete_all() -> str:
            self.ran.append("delete_all")
            return "deleted"

        @server.prompt()
        def plan() -> str:
            self.ran.append("plan")
            return "Plan the day."

        @server.prompt(name="internal-plan")
        def internal_plan() -> str:
            self.ran.append("internal-plan")
            return "The internal plan."

    def make(self, *, json_response: bool) -> Callable[[], tuple[Any, UpstreamProbe]]:
        def made() -> tuple[Any, UpstreamProbe]:
            probe = UpstreamProbe()
            app = self.server.streamable_http_app(streamable_http_path="/mcp",
                                                  json_response=json_response,
                                                  stateless_http=json_response)
            return _recording(app, probe), probe

        return made


async def sender(raw: httpx.AsyncClient, url: str, era: str) -> Send:
    """A raw caller of `era`: a 2026-07-28 one sends each request alone, a legacy one on the
    session it opens first."""
    if era == "2026-07-28":
        return lambda method, params: modern_post(raw, url, method, params)
    opened = await legacy_post(raw, url, {
        "jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": {"name": "raw", "version": "1"}}})
    assert opened.status_code == 200, opened.text
    sid = opened.headers["mcp-session-id"]
    await legacy_post(raw, url, {"jsonrpc": "2.0", "method": "notifications/initialized"}, sid)

    async def send(method: str, params: dict[str, Any]) -> httpx.Response:
        return await legacy_post(raw, url, {"jsonrpc": "2.0", "id": 1, "method": method,
                                            "params": params}, sid)

    return send


def shape(response: httpx.Response, name: str) -> tuple[int, str, str]:
    """Status, content type and body of an answer, the name it carries taken out."""
    body = orjson.dumps(answer_of(response)).decode().replace(name, "<name>")
    return response.status_code, response.headers["content-type"], body


def refusals(stack: Stack, method: str) -> list[tuple[str, str]]:
    """The audit's refused `method` calls: status, and the rule or the error."""
    return sorted((r["status"], r["denied_reason"] or r["error_message"])
                  for r in query(stack.db_path, limit=100)
                  if r["method"] == method and r["status"] != "ok")


def reached(probe: UpstreamProbe, method: str) -> list[Any]:
    return [ex.rpc["params"]["name"] for ex in probe.posts(method)]


@pytest.mark.parametrize("json_response", [True, False], ids=["json", "sse"])
@pytest.mark.parametrize("era", ["legacy", "2026-07-28"])
async def test_a_hidden_name_answers_as_one_that_does_not_exist(
        tmp_path: Path, era: str, json_response: bool) -> None:
    up = Upstream()
    async with open_stack(tmp_path, up.make(json_response=json_response),
                          access=ACCESS) as stack, \
            httpx.AsyncClient(timeout=DEADLINE_S) as raw:
        send = await sender(raw, stack.endpoint, era)
        for method, hidden, unknown, noun, _ in CASES:
            field = {"arguments": {}} if method == "tools/call" else {}
            answers = {name: shape(await send(method, {"name": name, **field}), name)
                       for name in (hidden, unknown)}
            assert answers[hidden] == answers[unknown] == (
                400, "application/json", ('{"jsonrpc":"2.0","id":1,"error":{"code":-32602,'
                f'"message":"{noun}<name>"}}}}')), answers
        # a name the upstream has still reaches it
        echoed = answer_of(await send("tools/call", {"name": "echo",
                                                      "arguments": {"text": "x"}}))
        assert echoed["result"]["content"][0]["text"] == "x"
        planned = answer_of(await send("prompts/get", {"name": "plan"}))
        assert "Plan the day." in orjson.dumps(planned).decode()
    assert up.ran == ["echo", "plan"]
    assert reached(stack.probe, "tools/call") == ["echo"]
    assert reached(stack.probe, "prompts/get") == ["plan"]
    for method, _, unknown, noun, rule in CASES:  # the audit tells which was which
        assert refusals(stack, method) == [("denied", rule), ("error", f"{noun}{unknown}")]


@pytest.mark.parametrize("json_response", [True, False], ids=["json", "sse"])
async def test_the_sdk_client_cannot_tell_hidden_from_unknown(tmp_path: Path,
                                                              json_response: bool) -> None:
    up = Upstream()
    async with open_stack(tmp_path, up.make(json_response=json_response),
                          access=ACCESS) as stack, connect(stack.endpoint) as client:
        for hidden, unknown, call in (
                ("delete_all", "nothing_here", lambda n: client.call_tool(n, {})),
                ("internal-plan", "no-such-prompt", lambda n: client.get_prompt(n))):
            errors = []
            for name in (hidden, unknown):
                with pytest.raises(MCPError) as caught:
                    await call(name)
                errors.append((caught.value.error.code,
                               caught.value.error.message.replace(name, "<name>"),
                               caught.value.error.data))
            assert errors[0] == errors[1], errors
            assert errors[0][0] == -32602 and errors[0][2] is None
    assert up.ran == []
    assert reached(stack.probe, "tools/call") == reached(stack.probe, "prompts/get") == []


async def test_a_tool_added_later_is_found_by_a_fresh_list(tmp_path: Path) -> None:
    """The gateway knows the upstream's tools from the last list; a name not in it is looked
    for in one fresh list before it is answered as unknown."""
    up = Upstream()
    async with open_stack(tmp_path, up.make(json_response=True), access=ACCESS) as stack, \
            httpx.AsyncClient(timeout=DEADLINE_S) as raw:
        listed = (await modern_post(raw, stack.endpoint, "tools/list")).json()["result"]
        assert [t["name"] for t in listed["tools"]] == ["echo"]
        lists = len(stack.probe.posts("tools/list"))

        def added(text: str) -> str:
            up.ran.append("added")
            return text.upper()

        up.server.add_tool(added, name="added")
        called = await modern_post(raw, stack.endpoint, "tools/call",
                                   {"name": "added", "arguments": {"text": "x"}})
        assert called.json()["result"]["content"][0]["text"] == "X"
        assert len(stack.probe.posts("tools/list")) == lists + 1  # one fresh list found it
    assert up.ran == ["added"]
