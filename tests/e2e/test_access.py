"""Identity and tool profiles end to end: the official SDK client with a bearer JWT, through the
gateway, to the official SDK server streaming SSE: the listing is filtered inside the stream and
a hidden tool is unknown."""

from __future__ import annotations

import time
from pathlib import Path

import jwt
import pytest
from mcp.shared.exceptions import MCPError

from proxy.app import create_app
from proxy.config import from_dict
from tests import db_backends
from tests.e2e.sdk_client import connect
from tests.e2e.upstreams import stateful_sse_app
from tests.servers import serve

SECRET = "a-shared-secret-of-at-least-32-bytes!"


def token(sub: str, groups: list[str]) -> str:
    return jwt.encode({"iss": "https://idp.test/", "aud": "http://127.0.0.1:8080/mcp/up",
                       "sub": sub, "groups": groups, "exp": int(time.time()) + 300},
                      SECRET, algorithm="HS256")


async def test_profiles_filter_the_streamed_listing_per_caller(tmp_path: Path) -> None:
    app, probe = stateful_sse_app()
    async with serve(app, graceful_timeout=1) as upstream_url:
        cfg = from_dict({
            "database": {"url": db_backends.url()},
            "auth": {"mode": "jwt", "issuers": [{"issuer": "https://idp.test/",
                                                  "hs256_secret": SECRET,
                                                  "algorithms": ["HS256"]}]},
            "upstreams": [{"name": "up", "url": f"{upstream_url}/mcp", "access": {
                "tools_allow": ["echo", "slow_*"], "tools_deny": ["slow_progress"],
                "group_tools": {"ops": {"tools_allow": ["wait_forever", "boom"]}}}}],
        }, env={})
        async with serve(create_app(cfg), graceful_timeout=1) as url:
            endpoint = f"{url}/mcp/up"
            headers = {"Authorization": f"Bearer {token('alice', ['eng'])}"}
            async with connect(endpoint, headers=headers) as client:
                names = sorted(t.name for t in (await client.list_tools()).tools)
                assert names == ["echo"]
                assert (await client.call_tool("echo", {"text": "x"})).content[0].text == "x"
                with pytest.raises(MCPError) as info:
                    await client.call_tool("boom", {})
                assert (info.value.error.code, info.value.error.message) == (
                    -32602, "Unknown tool: boom")
            ops = {"Authorization": f"Bearer {token('olga', ['ops'])}"}
            async with connect(endpoint, headers=ops) as client:
                names = sorted(t.name for t in (await client.list_tools()).tools)
                assert names == ["boom", "echo", "wait_forever"]
    assert [c.name for c in probe.calls] == ["echo"]  # the hidden call never reached it
    for call in probe.calls:
        assert "authorization" not in call.headers
