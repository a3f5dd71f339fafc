"""A virtual endpoint between the eras as a plain endpoint's bridge is: official-SDK members
behind /mcp/team and, beside it, the same servers on their own endpoints, so that what the
virtual endpoint does can be compared with what the plain bridge does."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import mcp_types as types
import orjson
import pytest
from mcp import Client, MCPError
from mcp.server.mcpserver import Context, MCPServer

from proxy.audit import query
from tests import db_backends
from tests.e2e.sdk_client import connect
from tests.e2e.upstreams import ASGIApp
from tests.stack import gateway_stack

MODERN = "2026-07-28"


def asking_app() -> ASGIApp:
    """An SDK server whose `ask_name` answers a 2026-07-28 call with an input_required result
    (an elicitation the client is to answer on its next round trip)."""
    server = MCPServer("asker", version="1.0.0")

    @server.tool()
    async def ask_name(ctx: Context) -> str | types.InputRequiredResult:
        """Ask the client for a name through an input_required result."""
        if ctx.input_responses:
            return "answered"
        return types.InputRequiredResult(input_requests={"name": types.ElicitRequest(
            params=types.ElicitRequestFormParams(message="What is your name?", requested_schema={
                "type": "object", "properties": {"name": {"type": "string"}}}))})

    return server.streamable_http_app(streamable_http_path="/mcp")


def checking_app() -> ASGIApp:
    """A stateful SDK server whose `declared` tool answers the client capabilities its session
    was opened with (what a server that checks them before asking would go by)."""
    server = MCPServer("checker", version="1.0.0")

    @server.tool()
    async def declared(ctx: Context) -> str:
        """The capabilities the session's client declared, as JSON."""
        params = ctx.session.client_params
        assert params is not None
        sampling = ctx.session.check_client_capability(
            types.ClientCapabilities(sampling=types.SamplingCapability()))
        caps = params.capabilities.model_dump(by_alias=True, exclude_none=True)
        return orjson.dumps({"caps": caps, "sampling": sampling}).decode()

    return server.streamable_http_app(streamable_http_path="/mcp")


@dataclass
class Stack:
    base: str
    db: str


@asynccontextmanager
async def gateway() -> AsyncIterator[Stack]:
    eras = {"asker": "modern", "checker": "legacy"}
    async with gateway_stack(lambda urls: {
            "upstreams": [{"name": name, "url": f"{url}/mcp", "era": eras[name]}
                          for name, url in urls.upstreams.items()],
            "endpoints": [{"name": "team", "members": ["asker", "checker"]}]},
            upstreams={"asker": asking_app(), "checker": checking_app()}) as site:
        yield Stack(site.url, db_backends.url())


async def refused(url: str, tool: str) -> Any:
    async with connect(url) as client:
        with pytest.raises(MCPError) as caught:
            await client.call_tool(tool, {})
    return caught.value.error


async def test_a_modern_members_input_required_is_refused_to_a_legacy_client_as_plain() -> None:
    async with gateway() as g:
        plain = await refused(f"{g.base}/mcp/asker", "ask_name")
        virtual = await refused(f"{g.base}/mcp/team", "asker__ask_name")
    assert plain.code == -32000 and "asked for input" in plain.message
    assert (virtual.code, virtual.message, virtual.data) == (plain.code, plain.message,
                                                             plain.data)
    records = {r["endpoint"]: r for r in query(g.db, limit=50) if r["method"] == "tools/call"}
    for key in ("status", "denied_reason", "error_message"):
        assert records["team"][key] == records["asker"][key], key
    assert records["team"]["status"] == "error"
    assert "member asker, name ask_name" in records["team"]["note"]


async def test_a_legacy_members_session_declares_what_the_client_declared() -> None:
    async def on_sampling(ctx: Any, params: Any) -> types.CreateMessageResult:
        raise AssertionError("not asked")

    async def on_elicit(ctx: Any, params: Any) -> types.ElicitResult:
        raise AssertionError("not asked")

    async def on_roots(ctx: Any) -> types.ListRootsResult:
        raise AssertionError("not asked")

    async def declared(client: Any) -> Any:
        result = await client.call_tool("checker__declared", {})
        return orjson.loads(result.content[0].text)

    async with gateway() as g:
        team = f"{g.base}/mcp/team"
        async with connect(team, sampling_callback=on_sampling, elicitation_callback=on_elicit,
                           list_roots_callback=on_roots) as client:
            full = await declared(client)
        async with connect(team) as client:
            bare = await declared(client)
        async with Client(team, mode=MODERN) as modern:
            sessionless = await declared(modern)
    # what the client declared, as far as the gateway relays it: its requests (roots'
    # listChanged is a notice from the client, which no member is sent)
    assert full["sampling"] is True
    assert set(full["caps"]) == {"sampling", "elicitation", "roots"}
    assert full["caps"]["roots"] == {}
    assert bare == {"caps": {}, "sampling": False}
    assert sessionless == {"caps": {}, "sampling": False}  # refused such requests: none
