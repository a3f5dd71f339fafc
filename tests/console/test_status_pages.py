"""The console's overview and servers pages show what /api/v1/sessions,
/api/v1/servers/{name}/status and /api/v1/server-status answer: active sessions, each
server's state, the protocol version seen, health figures and the tools as last seen; the
servers list a page at a time (no browser: the pages' HTML)."""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

import pytest
from mcp import MCPError

from proxy.console import admin
from proxy.console.api import call as api_call
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


async def test_the_servers_page_pages_and_asks_states_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A page of servers by name, newer and older links as the keys page has, each shown
    server's state from one /server-status request (never one per server); an offset that
    is not a whole number is the first page."""
    monkeypatch.setattr(admin, "SERVERS_PAGE", 2)
    asked: list[tuple[str, Any]] = []

    async def counted(web: Any, method: str, path: str, **kw: Any) -> Any:
        asked.append((path, kw.get("params")))
        return await api_call(web, method, path, **kw)

    monkeypatch.setattr(admin, "call", counted)
    async with env(tmp_path) as e:
        for name in ("a1", "a2", "a3"):
            made = await e.admin.post(e.api("/servers"), json={
                "name": name, "url": f"{e.upstream}/mcp", "zones": ["loopback"]})
            assert made.status_code == 201
        auth = {"Authorization": f"Bearer {e.admin_key}"}
        async with connect(f"{e.url}/mcp/cfgd", headers=auth) as client:
            await client.list_tools()
        root = await signed_in(e, "root", "root-password")
        pages = {}
        for offset in ("0", "2", "4", "x", "-2", "²", "1234567890"):
            asked.clear()
            page = await root.get(f"{e.url}/console/servers", params={"offset": offset})
            assert page.status_code == 200, (offset, page.text)
            pages[offset] = page.text
            assert [p for p, _ in asked] == (["/servers", "/server-status"] if offset != "4"
                                             else ["/servers"]), offset
        first, second, past = pages["0"], pages["2"], pages["4"]
        # the last page asked (a bad offset): the first page's two requests
        assert asked[0][1] == {"limit": "3", "offset": "0"}
        assert asked[1][1] == {"name": ["a1", "a2"]}
        for bad in ("x", "-2", "²", "1234567890"):
            assert pages[bad] == first
        assert 'href="/console/servers/a1"' in first and 'href="/console/servers/a2"' in first
        assert "/console/servers/a3" not in first and "/console/servers/cfgd" not in first
        assert 'href="/console/servers?offset=2" rel="next">More servers' in first
        assert "Previous servers" not in first
        assert first.count('class="state state-idle">idle<') == 2
        assert 'href="/console/servers/a3"' in second and 'href="/console/servers/cfgd"' in second
        assert 'href="/console/servers?offset=0">Previous servers' in second
        assert "More servers" not in second
        # cfgd's state and protocol version seen, from the one request
        assert 'class="state state-ok">ok<' in second and "<td>2025-11-25</td>" in second
        assert "No servers." in past and 'href="/console/servers?offset=2">Previous' in past
        await root.aclose()
