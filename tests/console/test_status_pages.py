"""The console's overview and servers pages show what /api/v1/sessions and
/api/v1/servers/{name}/status answer: active sessions, each server's state, the protocol
version seen, health figures and the tools as last seen (no browser: the pages' HTML)."""

from __future__ import annotations

import html
from pathlib import Path

import pytest
from mcp import MCPError

from proxy.console.guard import CSP
from tests.api.test_api import env, signed_in
from tests.e2e.sdk_client import connect


async def test_overview_and_servers_pages_show_sessions_state_and_tools(
        tmp_path: Path) -> None:
    async with env(tmp_path, shared_state=True) as e:
        root = await signed_in(e, "root", "root-password")
        before = await root.get(f"{e.url}/console/servers/cfgd")
        assert before.status_code == 200
        assert "No tools/list relayed for this server yet." in before.text
        assert 'class="state state-idle">idle<' in before.text
        auth = {"Authorization": f"Bearer {e.admin_key}"}
        async with connect(f"{e.url}/mcp/cfgd", headers=auth) as client:
            await client.list_tools()
            with pytest.raises(MCPError):
                await client.call_tool("nope", {})
            overview = await root.get(f"{e.url}/console/")
            assert overview.status_code == 200
            assert "Active sessions" in overview.text
            assert "<strong>1</strong>" in overview.text and "cfgd 1" in overview.text
            page = await root.get(f"{e.url}/console/servers/cfgd")
            listing = await root.get(f"{e.url}/console/servers")
        for answer in (overview, page, listing):
            assert answer.headers["content-security-policy"] == CSP
            assert "<script>" not in answer.text and "style=" not in answer.text
        text = html.unescape(page.text)
        assert 'class="state state-failing">failing<' in text  # the latest call failed
        assert "2025-11-25" in text
        assert "upstream error -32602" in text
        for name in ("<code>echo</code>", "<code>add</code>", "<code>count</code>"):
            assert name in text
        assert "Echo the text back." in text
        assert 'class="state state-failing">failing<' in listing.text
        await root.aclose()
