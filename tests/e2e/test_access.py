"""Identity and tool profiles end to end: the official SDK client with a bearer JWT, through the
gateway, to the official SDK server streaming SSE: the listing is filtered inside the stream and
a hidden tool is unknown."""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from mcp.shared.exceptions import MCPError
from mcp.types import PromptReference, ResourceTemplateReference

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


@pytest.mark.filterwarnings("ignore:resources/.*subscribe is removed")  # a 2025-11-25 client
async def test_completions_and_subscriptions_answer_to_the_prompt_and_resource_rules(
        tmp_path: Path) -> None:
    """completion/complete and resources/(un)subscribe name a prompt or resource as the calls
    do: a denied one answers as unknown and never reaches the upstream; an allowed one does."""
    access = {"prompts_deny": ["internal-*"], "resources_deny": ["file:///secret/*"]}
    secret_template = ResourceTemplateReference(type="ref/resource", uri="file:///secret/{n}")
    async with open_stack(tmp_path, stateful_sse_app, config={"auth": jwt_auth()},
                          access=access) as stack, \
            connect(stack.endpoint, headers=bearer("alice", ["eng"])) as client:
        denied: list[tuple[Callable[[], Awaitable[Any]], str]] = [
            (lambda: client.complete(PromptReference(type="ref/prompt", name="internal-plan"),
                                     {"name": "a", "value": "b"}),
             "Unknown prompt: internal-plan"),
            (lambda: client.complete(secret_template, {"name": "n", "value": "k"}),
             "Resource not found: file:///secret/{n}"),
            (lambda: client.subscribe_resource("file:///secret/key"),
             "Resource not found: file:///secret/key"),
            (lambda: client.unsubscribe_resource("file:///secret/key"),
             "Resource not found: file:///secret/key")]
        for request, message in denied:
            with pytest.raises(MCPError) as info:
                await request()
            assert (info.value.error.code, info.value.error.message) == (-32602, message)
        for method in ("completion/complete", "resources/subscribe", "resources/unsubscribe"):
            assert stack.probe.posts(method) == []
        # an allowed name reaches the upstream (which has no such prompt or subscriptions,
        # and answers so itself)
        with contextlib.suppress(MCPError):
            await client.complete(PromptReference(type="ref/prompt", name="plan"),
                                  {"name": "a", "value": "b"})
        with contextlib.suppress(MCPError):
            await client.subscribe_resource("file:///public/readme")
        assert len(stack.probe.posts("completion/complete")) == 1
        assert len(stack.probe.posts("resources/subscribe")) == 1
