"""Every MCP feature through a stdio upstream, at the HTTP edge with the official SDK client:
tools, prompts, resources, progress, logging, server-to-client requests routed back to the
caller that raised them, cancellation with the process's own id, both eras, multiplexing on
one shared process, policies and audit records."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from mcp import Client, MCPError, types

from tests.e2e.sdk_client import connect
from tests.helpers import DEADLINE_S, until
from tests.stdio.conftest import TINY, stdio_gateway, transport_of

MODERN = "2026-07-28"


def text(result: types.CallToolResult) -> str:
    content = result.content[0]
    assert isinstance(content, types.TextContent)
    return content.text


async def test_tools_prompts_resources_progress_and_logging() -> None:
    logged: list[Any] = []

    async def on_log(params: types.LoggingMessageNotificationParams) -> None:
        logged.append(params.data)

    async with stdio_gateway() as gw, connect(gw.endpoint("local"),
                                             logging_callback=on_log) as client:
        assert client.protocol_version == "2025-11-25"
        names = {t.name for t in (await client.list_tools()).tools}
        assert {"echo", "slow", "ask_sampling", "crash"} <= names
        assert text(await client.call_tool("echo", {"text": "hi"})) == "hi"
        prompt = await client.get_prompt("greet", {"name": "Ada"})
        assert "Hello, Ada!" in str(prompt.messages[0].content)
        resources = await client.list_resources()
        assert [str(r.uri) for r in resources.resources] == ["note://one"]
        read = await client.read_resource("note://one")
        assert read.contents[0].text == "the note"
        progress: list[float] = []

        async def on_progress(value: float, total: float | None, message: str | None) -> None:
            progress.append(value)

        result = await client.call_tool("slow", {"steps": 3}, progress_callback=on_progress)
        assert text(result) == "done" and progress == [1, 2, 3]
        assert text(await client.call_tool("log", {"message": "hello log"})) == "logged"
        await until(lambda: "hello log" in logged)
    records = [r for r in gw.audit.records if r.method == "tools/call"]
    assert {r.tool for r in records} >= {"echo", "slow", "log"}
    assert all(r.status == "ok" and r.endpoint == "local" for r in records)


async def test_server_requests_go_back_to_the_caller_that_raised_them() -> None:
    async def on_sampling(ctx: object, params: types.CreateMessageRequestParams
                          ) -> types.CreateMessageResult:
        return types.CreateMessageResult(role="assistant", model="m",
                                         content=types.TextContent(type="text", text="sampled"))

    async def on_elicit(ctx: object, params: Any) -> types.ElicitResult:
        return types.ElicitResult(action="accept", content={"answer": "yes"})

    async def on_roots(ctx: object) -> types.ListRootsResult:
        return types.ListRootsResult(roots=[types.Root(uri="file:///srv/a")])

    async with stdio_gateway() as gw, \
            connect(gw.endpoint("local"), sampling_callback=on_sampling,
                    elicitation_callback=on_elicit, list_roots_callback=on_roots) as client, \
            connect(gw.endpoint("local")) as bystander:
        assert text(await bystander.call_tool("echo", {"text": "x"})) == "x"
        assert text(await client.call_tool("ask_sampling", {"prompt": "p"})) == "sampled"
        assert text(await client.call_tool("ask_elicitation", {"message": "m"})) == "accept:yes"
        assert text(await client.call_tool("ask_roots", {})) == "file:///srv/a"
        assert len(transport_of(gw).pool.running()) == 1  # one shared process for both


async def test_many_callers_share_one_process_without_seeing_each_other() -> None:
    async with stdio_gateway() as gw:
        async def one(i: int) -> tuple[str, list[float], str]:
            seen: list[float] = []

            async def on_progress(value: float, total: float | None, msg: str | None) -> None:
                seen.append(value)

            async with connect(gw.endpoint("local")) as client:
                # every SDK client numbers its requests from 0: the ids collide on purpose
                result = await client.call_tool("slow", {"steps": 2 + i % 3},
                                                progress_callback=on_progress)
                pid = text(await client.call_tool("pid", {}))
                return text(result), seen, pid

        results = await asyncio.gather(*(one(i) for i in range(8)))
        for i, (answer, seen, _pid) in enumerate(results):
            assert answer == "done"
            assert seen == [float(n) for n in range(1, 3 + i % 3)]
        assert len({pid for _, _, pid in results}) == 1  # one process, and still running
        assert transport_of(gw).pool.started == 1
        assert len(transport_of(gw).pool.running()) == 1


async def test_cancelling_tells_the_process_with_its_own_id(caplog: pytest.LogCaptureFixture
                                                            ) -> None:
    caplog.set_level(logging.INFO, logger="tollhouse.stdio")
    started = asyncio.Event()

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        started.set()

    async with stdio_gateway() as gw, connect(gw.endpoint("local")) as client:
        await client.call_tool("echo", {"text": "a"})  # the gateway's ids and the process's differ
        call = asyncio.create_task(client.call_tool("slow", {"steps": 1, "wait": True},
                                                    progress_callback=on_progress))
        await asyncio.wait_for(started.wait(), DEADLINE_S)
        call.cancel()
        await until(lambda: "slow: cancelled" in caplog.text)
        assert text(await client.call_tool("echo", {"text": "after"})) == "after"
        await until(lambda: not transport_of(gw).pool.running()[0].calls)


async def test_a_2026_caller_is_bridged_onto_the_stdio_process() -> None:
    async with stdio_gateway() as gw:
        async with Client(gw.endpoint("local"), mode=MODERN) as client:
            assert "echo" in {t.name for t in (await client.list_tools()).tools}
            result = await client.call_tool("echo", {"text": "modern"})
            assert result.content[0].text == "modern"  # type: ignore[union-attr]
        (record,) = [r for r in gw.audit.records if r.tool == "echo"]
        assert record.era == "modern" and record.status == "ok"


async def test_policies_apply_to_a_stdio_upstream() -> None:
    async with stdio_gateway(access={"tools_deny": ["crash"]}) as gw, \
            connect(gw.endpoint("local")) as client:
        assert "crash" not in {t.name for t in (await client.list_tools()).tools}
        with pytest.raises(MCPError):
            await client.call_tool("crash", {})
        assert text(await client.call_tool("echo", {"text": "still"})) == "still"
    denied = [r for r in gw.audit.records if r.tool == "crash"]
    assert denied and denied[0].status == "denied"


async def test_a_session_from_elsewhere_is_taken_up() -> None:
    """Another replica's session (its process is not this one's) goes on here, on this
    replica's process: the stdio session is the gateway's own label."""
    async with stdio_gateway() as gw, connect(gw.endpoint("local")) as client:
        route = gw.gateway.routes["local"]
        session = await gw.gateway.sessions.get(client.session_id or "")
        assert session is not None and session.upstream_session_id
        transport_of(gw)._sessions.clear()  # as if the session began on another replica
        assert text(await client.call_tool("echo", {"text": "moved"})) == "moved"
        assert route.transport is transport_of(gw)


async def test_list_changed_reaches_every_session_s_get_stream() -> None:
    heard: list[asyncio.Event] = [asyncio.Event(), asyncio.Event()]

    def handler(n: int) -> Any:
        async def on_message(message: Any) -> None:
            if isinstance(message, types.ToolListChangedNotification):
                heard[n].set()
        return on_message

    async with stdio_gateway(args=[TINY]) as gw, \
            connect(gw.endpoint("local"), message_handler=handler(0)) as first, \
            connect(gw.endpoint("local"), message_handler=handler(1)) as second:
        assert text(await second.call_tool("echo", {"text": "x"})) == "x"
        await until(lambda: sum(len(s.listeners) for s in transport_of(gw)._sessions.values())
                    == 2)  # both GET streams are open
        await first.call_tool("announce", {})
        await asyncio.wait_for(asyncio.gather(heard[0].wait(), heard[1].wait()), DEADLINE_S)


async def test_a_server_request_that_could_be_anyone_s_is_refused_not_guessed() -> None:
    """Two sessions with calls in flight: stdio does not say which one a sampling request is
    for, so neither client is asked; the call that asked gets the refusal."""
    asked: list[str] = []
    started = asyncio.Event()

    async def on_sampling(ctx: object, params: types.CreateMessageRequestParams
                          ) -> types.CreateMessageResult:
        asked.append("someone")
        return types.CreateMessageResult(role="assistant", model="m",
                                         content=types.TextContent(type="text", text="leak"))

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        started.set()

    async with stdio_gateway() as gw, \
            connect(gw.endpoint("local"), sampling_callback=on_sampling) as waiting, \
            connect(gw.endpoint("local"), sampling_callback=on_sampling) as asking:
        held = asyncio.create_task(waiting.call_tool("slow", {"steps": 1, "wait": True},
                                                     progress_callback=on_progress))
        await asyncio.wait_for(started.wait(), DEADLINE_S)
        with pytest.raises(MCPError, match="no single caller to ask"):
            await asking.call_tool("ask_sampling", {"prompt": "p"})
        assert asked == []
        held.cancel()
