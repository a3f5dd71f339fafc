"""/api/v1/endpoints: virtual endpoints created, changed and deleted through the API, live on
the next request, with the config file's collision rules as 409s; a member registered or
removed through /api/v1/servers joins or leaves the endpoint on the next request."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import orjson

from tests.api.test_api import Env, detail, env
from tests.conftest import MCP_HEADERS


async def tools(e: Env, endpoint: str) -> httpx.Response:
    call = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    async with httpx.AsyncClient(timeout=10) as mcp:
        return await mcp.post(f"{e.url}/mcp/{endpoint}", content=orjson.dumps(call),
                              headers={**MCP_HEADERS, "Authorization": f"Bearer {e.admin_key}"})


def names(response: httpx.Response) -> set[str]:
    assert response.status_code == 200, response.text
    return {t["name"] for t in response.json()["result"]["tools"]}


async def test_endpoints_crud_collisions_and_registry_changes(tmp_path: Path) -> None:
    async with env(tmp_path) as e:
        spec: dict[str, Any] = {"name": "team", "members": ["cfgd", "live"],
                                "aliases": {"say": "cfgd:echo"}}
        created = await e.admin.post(e.api("/endpoints"), json=spec)
        assert created.status_code == 201, created.text
        assert created.json()["source"] == "api"
        assert created.json()["mcp_url"] == f"{e.url}/mcp/team"
        listed = (await e.admin.get(e.api("/endpoints"))).json()["items"]
        assert [x["name"] for x in listed] == ["team"]
        async with httpx.AsyncClient() as anonymous:  # discovery, as for a plain endpoint
            found = await anonymous.get(
                f"{e.url}/.well-known/oauth-protected-resource/mcp/team")
        assert found.status_code == 200 and found.json()["resource"] == f"{e.url}/mcp/team"
        first = names(await tools(e, "team"))  # live on the next request; `live` not yet
        assert "say" in first and "cfgd__count" in first
        assert not any(n.startswith("live__") for n in first)
        server = {"name": "live", "url": f"{e.upstream}/mcp", "zones": ["loopback"]}
        assert (await e.admin.post(e.api("/servers"), json=server)).status_code == 201
        assert "live__echo" in names(await tools(e, "team"))
        assert (await e.admin.delete(e.api("/servers/live"))).status_code == 204
        assert "live__echo" not in names(await tools(e, "team"))

        for clash, words in [
                ({**spec}, "already exists"),
                ({**spec, "name": "cfgd"}, "upstream 'cfgd'"),
                ({**spec, "name": "t2", "aliases": {"live__x": "cfgd:echo"}}, "'live__x'"),
                ({**spec, "name": "t3", "members": ["cfgd", "cfgd__b"]}, "separator")]:
            refused = await e.admin.post(e.api("/endpoints"), json=clash)
            assert refused.status_code == 409, refused.text
            assert words in detail(refused)
        taken = await e.admin.post(e.api("/servers"), json={**server, "name": "team"})
        assert taken.status_code == 409 and "virtual endpoint" in detail(taken)
        bad = await e.admin.post(e.api("/endpoints"), json={"name": "t4", "members": []})
        assert bad.status_code == 422 and isinstance(detail(bad), list)

        patched = await e.admin.patch(e.api("/endpoints/team"),
                                      json={"separator": "-", "aliases": {}})
        assert patched.status_code == 200 and patched.json()["separator"] == "-"
        assert "cfgd-echo" in names(await tools(e, "team"))
        put = await e.admin.put(e.api("/endpoints/team"), json={**spec, "name": "other"})
        assert put.status_code == 422
        assert (await e.admin.delete(e.api("/endpoints/team"))).status_code == 204
        gone = await tools(e, "team")
        assert gone.status_code == 404 and gone.json() == {"error": "not found"}
        missing = await e.admin.get(e.api("/endpoints/team"))
        assert missing.status_code == 404 and detail(missing) == "endpoint 'team' not found"


async def test_a_reload_keeps_api_endpoints_and_their_rules(tmp_path: Path) -> None:
    async with env(tmp_path) as e:
        spec = {"name": "team", "members": ["cfgd"], "access": {"tools_deny": ["cfgd__add"]}}
        assert (await e.admin.post(e.api("/endpoints"), json=spec)).status_code == 201
        before = names(await tools(e, "team"))
        assert "cfgd__echo" in before and "cfgd__add" not in before
        serving = e.app.extensions["tollhouse"].serving
        path = tmp_path / "c.toml"
        running = serving.gateway.live.cfg
        path.write_text(
            f'[server]\npublic_url = "{e.url}"\n[auth]\nmode = "jwt"\n'
            f'[oauth_server]\nenabled = true\n[database]\nurl = "{e.db}"\n'
            f'[[upstreams]]\nname = "cfgd"\nurl = "{running.upstreams[0].url}"\n'
            '[[endpoints]]\nname = "filed"\nmembers = ["cfgd"]\nseparator = "."\n')
        assert await serving.reload(path)
        after = names(await tools(e, "team"))
        assert "cfgd__echo" in after and "cfgd__add" not in after  # its rules, as stored
        assert "cfgd.add" in names(await tools(e, "filed"))


async def test_tool_search_is_set_through_the_api_as_in_the_config(tmp_path: Path) -> None:
    """`search` in an endpoint's body is the config's `[endpoints.search]`: checked as the
    config file is (422 naming the field), answered back, and live on the next request."""
    async with env(tmp_path) as e:
        spec: dict[str, Any] = {"name": "found", "members": ["cfgd"],
                                "search": {"mode": "search", "max_results": 3,
                                           "always": ["cfgd__echo"]}}
        for bad, field in (({"mode": "bm25"}, "mode"), ({"max_results": 0}, "max_results"),
                           ({"max_results": 51}, "max_results"),
                           ({"always": ["call_tool"]}, "always"),
                           ({"always": ["a b"]}, "always"), ({"ranker": "x"}, "ranker")):
            refused = await e.admin.post(e.api("/endpoints"), json={**spec, "search": bad})
            assert refused.status_code == 422, (bad, refused.text)
            assert field in str(refused.json()["detail"]), refused.text
        alias = await e.admin.post(e.api("/endpoints"), json={
            **spec, "aliases": {"search_tools": "cfgd:echo"}})
        assert alias.status_code == 422 and "meta-tool" in alias.text
        created = await e.admin.post(e.api("/endpoints"), json=spec)
        assert created.status_code == 201, created.text
        assert created.json()["search"] == {"mode": "search", "max_results": 3,
                                            "always": ["cfgd__echo"]}
        assert names(await tools(e, "found")) == {"search_tools", "call_tool", "cfgd__echo"}
        off = await e.admin.patch(e.api("/endpoints/found"), json={"search": {"mode": "off"}})
        assert off.status_code == 200 and off.json()["search"]["mode"] == "off"
        assert "cfgd__count" in names(await tools(e, "found"))
