"""MCP Apps through a virtual endpoint, end to end with a real server no one here wrote: the
example `@modelcontextprotocol/server-basic-vanillajs` (pinned, from npm) run as a stdio
member `apps` of /mcp/team beside an official-SDK member, reached by the official SDK client in
both eras. A host lists the tools, reads the UI resource the tool advertises, and gets the
HTML (issue 38: the advertised URI used to name a resource the endpoint did not serve)."""

from __future__ import annotations

import shutil

import pytest
from mcp import Client, MCPError

from tests.stdio.conftest import stdio_gateway
from tests.virtual import apps_server

pytestmark = pytest.mark.skipif(shutil.which("npm") is None,
                                reason="npm is not installed: no Node MCP Apps server to run")

MIME = "text/html;profile=mcp-app"


@pytest.fixture(scope="module")
def installed() -> None:
    reason = apps_server.ensure()
    if reason is not None:
        pytest.skip(reason)


def apps_member() -> dict[str, object]:
    return {"name": "apps", "command": apps_server.COMMAND[0], "args": apps_server.COMMAND[1:],
            "cwd": str(apps_server.DIRECTORY), "env": {}, "start_timeout_s": 60}


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
async def test_a_host_reads_the_ui_resource_a_tool_advertises(installed: None,
                                                             mode: str) -> None:
    endpoints = {"endpoints": [{"name": "team", "members": ["apps"]}]}
    async with stdio_gateway(endpoints, **apps_member()) as gw, \
            Client(gw.endpoint("team"), mode=mode) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
        tool = tools["apps__get-time"]
        meta = tool.meta or {}
        advertised = meta["ui"]["resourceUri"]
        assert advertised == "ui://apps/get-time/mcp-app.html"
        assert meta["ui/resourceUri"] == advertised  # the older key the server sets too
        listed = {r.uri: r for r in (await client.list_resources()).resources}
        assert set(listed) == {advertised}  # the same URI the tool names
        assert listed[advertised].mime_type == MIME
        read = await client.read_resource(advertised)
        (content,) = read.contents
        assert content.uri == advertised
        assert content.mime_type == MIME
        assert content.text == apps_server.html()  # type: ignore[union-attr]
        called = await client.call_tool("apps__get-time", {})
        assert not called.is_error and called.structured_content is not None
        # the member's own URI names no member here: unknown, and no member asked
        with pytest.raises(MCPError) as caught:
            await client.read_resource("ui://get-time/mcp-app.html")
        assert caught.value.error.code == -32602
    reads = [r for r in gw.audit.records if r.method == "resources/read"]
    assert [r.status for r in reads] == ["ok", "error"]


async def test_the_plain_endpoint_is_unchanged(installed: None) -> None:
    """The member's own endpoint shows the server's own URI, as before."""
    async with stdio_gateway(**apps_member()) as gw, \
            Client(gw.endpoint("apps"), mode="legacy") as client:
        (tool,) = (await client.list_tools()).tools
        assert (tool.meta or {})["ui"]["resourceUri"] == "ui://get-time/mcp-app.html"
        read = await client.read_resource("ui://get-time/mcp-app.html")
        assert read.contents[0].uri == "ui://get-time/mcp-app.html"
