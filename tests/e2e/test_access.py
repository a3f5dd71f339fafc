"""Identity and tool profiles end to end: the official SDK client with a bearer JWT, through the
gateway, to the official SDK server streaming SSE: the listing is filtered inside the stream and
a hidden tool is unknown."""

from __future__ import annotations

from pathlib import Path

import pytest
from mcp.shared.exceptions import MCPError

from tests.e2e.conftest import open_stack
from tests.e2e.sdk_client import connect
from tests.e2e.upstreams import stateful_sse_app
from tests.helpers import jwt_auth, token


def bearer(sub: str, groups: list[str]) -> dict[str, str]:
    return {"Authorization": f"Bearer {token(endpoint='up', sub=sub, groups=groups)}"}


async def test_profiles_filter_the_streamed_listing_per_caller(tmp_path: Path) -> None:
    access = {"tools_allow": ["echo", "slow_*"], "tools_deny": ["slow_progress"],
              "group_tools": {"ops": {"tools_allow": ["wait_forever", "boom"]}}}
    async with open_stack(tmp_path, stateful_sse_app, config={"auth": jwt_auth()},
                          access=access) as stack:
        async with connect(stack.endpoint, headers=bearer("alice", ["eng"])) as client:
            names = sorted(t.name for t in (await client.list_tools()).tools)
            assert names == ["echo"]
            assert (await client.call_tool("echo", {"text": "x"})).content[0].text == "x"
            with pytest.raises(MCPError) as info:
                await client.call_tool("boom", {})
            assert (info.value.error.code, info.value.error.message) == (
                -32602, "Unknown tool: boom")
        async with connect(stack.endpoint, headers=bearer("olga", ["ops"])) as client:
            names = sorted(t.name for t in (await client.list_tools()).tools)
            assert names == ["boom", "echo", "wait_forever"]
    assert [c.name for c in stack.probe.calls] == ["echo"]  # the hidden call never reached it
    for call in stack.probe.calls:
        assert "authorization" not in call.headers
