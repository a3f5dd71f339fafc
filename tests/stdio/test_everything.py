"""The reference Node server, `@modelcontextprotocol/server-everything` (pinned, from npm),
started with `npx` under the default limits and reached through the gateway by the official
SDK client: tools, prompts, resources, progress, sampling, and a confined environment."""

from __future__ import annotations

import shutil
from typing import Any

import orjson
import pytest
from mcp import types

from tests.e2e.sdk_client import connect
from tests.stdio import everything
from tests.stdio.conftest import stdio_gateway

pytestmark = pytest.mark.skipif(shutil.which("npm") is None,
                                reason="npm is not installed: no Node stdio server to run")


@pytest.fixture(scope="module")
def installed() -> None:
    reason = everything.ensure()
    if reason is not None:
        pytest.skip(reason)


async def test_server_everything_through_the_gateway(installed: None,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOLLHOUSE_TEST_GATEWAY_SECRET", "never-in-a-child")

    async def on_sampling(ctx: object, params: types.CreateMessageRequestParams
                          ) -> types.CreateMessageResult:
        return types.CreateMessageResult(role="assistant", model="m",
                                         content=types.TextContent(type="text", text="sampled!"))

    progress: list[float] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append(value)

    async with stdio_gateway(command="npx", args=["--no-install", "mcp-server-everything",
                                                  "stdio"],
                             cwd=str(everything.DIRECTORY), env={"EVERYTHING": "yes"},
                             start_timeout_s=60) as gw, \
            connect(gw.endpoint("local"), sampling_callback=on_sampling) as client:
        names = {t.name for t in (await client.list_tools()).tools}
        assert {"echo", "get-sum", "trigger-long-running-operation"} <= names
        echoed = await client.call_tool("echo", {"message": "from node"})
        assert "from node" in _text(echoed)
        assert "5" in _text(await client.call_tool("get-sum", {"a": 2, "b": 3}))
        result = await client.call_tool("trigger-long-running-operation",
                                        {"duration": 0.2, "steps": 2},
                                        progress_callback=on_progress)
        assert not result.is_error and progress == [1, 2]
        sampled = await client.call_tool("trigger-sampling-request",
                                         {"prompt": "hi", "maxTokens": 5})
        assert "sampled!" in _text(sampled)
        prompts = await client.list_prompts()
        assert "simple-prompt" in {p.name for p in prompts.prompts}
        assert (await client.get_prompt("simple-prompt")).messages
        resources = await client.list_resources()
        assert resources.resources
        read = await client.read_resource(resources.resources[0].uri)
        assert read.contents
        env: dict[str, Any] = orjson.loads(_text(await client.call_tool("get-env", {})))
        assert env.get("EVERYTHING") == "yes"
        assert "TOLLHOUSE_TEST_GATEWAY_SECRET" not in env
    assert {r.status for r in gw.audit.records if r.method == "tools/call"} == {"ok"}


def _text(result: types.CallToolResult) -> str:
    return " ".join(c.text for c in result.content if isinstance(c, types.TextContent))
