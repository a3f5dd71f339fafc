"""A virtual endpoint's server-to-client traffic end to end: official-SDK members asking the
official SDK client for sampling, elicitation and roots through /mcp/team, their log, progress
and list_changed notices relayed with the member named, and the client's answers reaching the
member that asked, never another."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import mcp_types as types
import orjson
import pytest
from mcp import Client, MCPError
from mcp.server.mcpserver import Context, MCPServer

from proxy.auth import keys as api_keys
from proxy.runtime.app import Services
from proxy.virtual.schema import EndpointIn
from tests import db_backends
from tests.e2e.sdk_client import connect
from tests.e2e.upstreams import ASGIApp, UpstreamProbe, stateful_sse_app, stateless_json_app
from tests.helpers import DEADLINE_S, until
from tests.stack import Urls, gateway_stack

MODERN = "2026-07-28"


def talker_app() -> ASGIApp:
    """A stateful SSE SDK server whose `chatter` tool logs, reports progress and says its
    tools changed, all on the call's stream, before it answers."""
    server = MCPServer("talker", version="1.0.0")

    @server.tool()
    async def chatter(text: str, ctx: Context, standalone: bool = False) -> str:
        """Log `text` (on the GET stream when `standalone`), report progress, announce a
        tools list change; return `text`."""
        session, rid = ctx.request_context.session, ctx.request_id
        await session.send_notification(types.LoggingMessageNotification(
            params=types.LoggingMessageNotificationParams(level="info", logger="db",
                                                          data=text)),
            related_request_id=None if standalone else rid)
        await ctx.report_progress(1, 2, "half")
        await session.send_notification(types.ToolListChangedNotification(),
                                        related_request_id=rid)
        return text

    return server.streamable_http_app(streamable_http_path="/mcp")


@dataclass
class Team:
    url: str
    alpha: UpstreamProbe
    state: Services

    def get_open(self) -> bool:
        return any(x.method == "GET" and x.status == 200 for x in self.alpha.exchanges)


@asynccontextmanager
async def team() -> AsyncIterator[Team]:
    alpha_app, alpha = stateful_sse_app()
    beta_app, _ = stateless_json_app()
    members = {"alpha": alpha_app, "beta": beta_app, "talker": talker_app()}
    async with gateway_stack(lambda urls: {
            "upstreams": legacy(urls),
            "endpoints": [{"name": "team", "members": list(members)}]},
            upstreams=members) as site:
        yield Team(site.endpoint("team"), alpha, site.services)


def legacy(urls: Urls) -> list[dict[str, Any]]:
    """Every served upstream, by its name, as a legacy-era upstream of the gateway."""
    return [{"name": name, "url": f"{url}/mcp", "era": "legacy"}
            for name, url in urls.upstreams.items()]


def answers_posted(probe: UpstreamProbe) -> list[Any]:
    """The JSON-RPC responses the member received (the client's answers, sent on)."""
    return [x.rpc for x in probe.exchanges if x.method == "POST" and isinstance(x.rpc, dict)
            and "method" not in x.rpc and ("result" in x.rpc or "error" in x.rpc)]


async def test_sampling_elicitation_and_roots_reach_the_client_and_answer_the_member() -> None:
    seen: list[Any] = []

    async def on_sampling(ctx: Any, params: types.CreateMessageRequestParams
                          ) -> types.CreateMessageResult:
        seen.append(ctx.request_id)
        return types.CreateMessageResult(role="assistant", model="test", content=types.TextContent(
            type="text", text=f"sampled: {params.messages[0].content.text}"))

    async def on_elicit(ctx: Any, params: Any) -> types.ElicitResult:
        seen.append(ctx.request_id)
        return types.ElicitResult(action="accept", content={"answer": "yes"})

    async def on_roots(ctx: Any) -> types.ListRootsResult:
        seen.append(ctx.request_id)
        return types.ListRootsResult(roots=[types.Root(uri="file:///work")])

    async with team() as t, connect(t.url, sampling_callback=on_sampling,
                                    elicitation_callback=on_elicit,
                                    list_roots_callback=on_roots) as client:
        result = await client.call_tool("alpha__ask_sampling", {"prompt": "hello"})
        assert result.content[0].text == "sampled: hello"
        result = await client.call_tool("alpha__ask_elicitation", {"message": "ok?"})
        assert result.content[0].text == "accept:yes"
        result = await client.call_tool("alpha__ask_roots", {})
        assert result.content[0].text == "file:///work"
    # the client saw ids the gateway sealed; the member got its answers under its own ids
    assert len(seen) == 3 and all(isinstance(i, str) and i.startswith("tv1.") for i in seen)
    posted = answers_posted(t.alpha)
    assert len(posted) == 3 and not any(str(a["id"]).startswith("tv1.") for a in posted)


async def test_a_forged_or_another_sessions_id_reaches_no_member() -> None:
    sealed: list[Any] = []

    async def on_sampling(ctx: Any, params: Any) -> types.CreateMessageResult:
        sealed.append(ctx.request_id)
        return types.CreateMessageResult(role="assistant", model="test",
                                         content=types.TextContent(type="text", text="ok"))

    async with team() as t, connect(t.url, sampling_callback=on_sampling) as first, \
            connect(t.url) as second, httpx.AsyncClient(timeout=DEADLINE_S) as raw:
        assert (await first.call_tool("alpha__ask_sampling", {"prompt": "x"})).content[0].text \
            == "ok"
        assert len(answers_posted(t.alpha)) == 1
        (real,) = sealed
        body, mac = real[len("tv1."):].split(".")
        altered = "tv1." + body + "." + ("A" if mac[0] != "A" else "B") + mac[1:]
        for session_id, rid in ((second.session_id, real), (first.session_id, altered),
                                (first.session_id, "tv1.W10.AAAAAAAAAAAAAAAAAAAAAA"),
                                (first.session_id, 0)):
            answer = await raw.post(t.url, content=orjson.dumps(
                {"jsonrpc": "2.0", "id": rid, "result": {"role": "assistant", "model": "x",
                                                         "content": {"type": "text",
                                                                     "text": "forged"}}}),
                headers={"content-type": "application/json",
                         "accept": "application/json, text/event-stream",
                         "mcp-session-id": session_id, "mcp-protocol-version": "2025-11-25"})
            assert answer.status_code == 202, answer.text
        # the same ids a real answer is sent on with: nothing more reached the member
        assert (await first.call_tool("alpha__echo", {"text": "after"})).content[0].text \
            == "after"
        assert len(answers_posted(t.alpha)) == 1


async def test_log_and_progress_name_the_member_and_list_changed_is_the_endpoints() -> None:
    logs: list[types.LoggingMessageNotificationParams] = []
    changed: list[Any] = []
    progress: list[tuple[float, str | None]] = []

    async def on_log(params: types.LoggingMessageNotificationParams) -> None:
        logs.append(params)

    async def on_message(message: Any) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            changed.append(message)

    async def on_progress(done: float, total: float | None, message: str | None) -> None:
        progress.append((done, message))

    async with team() as t, connect(t.url, logging_callback=on_log,
                                    message_handler=on_message) as client:
        caps = client.initialize_result.capabilities
        assert caps.tools is not None and caps.tools.list_changed
        result = await client.call_tool("talker__chatter", {"text": "hi"},
                                        progress_callback=on_progress)
        assert result.content[0].text == "hi"
        await until(lambda: logs and progress and changed, what="the member's notices")
    assert [(x.logger, x.data) for x in logs] == [("talker/db", "hi")]
    assert progress == [(1, "talker: half")]  # the client's own progressToken routed it
    assert len(changed) == 1


async def test_a_modern_client_is_refused_a_legacy_members_request() -> None:
    async with team() as t, Client(t.url, mode=MODERN) as client:
        result = await client.call_tool("talker__chatter", {"text": "still fine"})
        assert result.content[0].text == "still fine"
        with pytest.raises(MCPError) as refused:  # the call ends: nothing carries the question
            await client.call_tool("alpha__ask_sampling", {"prompt": "x"})
        assert refused.value.error.code == -32000
    assert not answers_posted(t.alpha)


async def test_the_get_stream_merges_the_members_streams() -> None:
    logs: list[types.LoggingMessageNotificationParams] = []

    async def on_sampling(ctx: Any, params: types.CreateMessageRequestParams
                          ) -> types.CreateMessageResult:
        return types.CreateMessageResult(role="assistant", model="test", content=types.TextContent(
            type="text", text=f"sampled: {params.messages[0].content.text}"))

    async def on_log(params: types.LoggingMessageNotificationParams) -> None:
        logs.append(params)

    async with team() as t, connect(t.url, sampling_callback=on_sampling,
                                    logging_callback=on_log) as client:
        await until(t.get_open, what="the member's GET stream to open")
        # alpha asks on its GET stream (no call to relate the request to), talker logs there
        result = await client.call_tool("alpha__ask_sampling", {"prompt": "aside",
                                                                "standalone": True})
        assert result.content[0].text == "sampled: aside"
        result = await client.call_tool("talker__chatter", {"text": "aside",
                                                            "standalone": True})
        await until(lambda: logs, what="the log on the GET stream")
    assert [(x.logger, x.data) for x in logs] == [("talker/db", "aside")]
    gets = [x for x in t.alpha.exchanges if x.method == "GET"]
    (call,) = t.alpha.tool_calls("ask_sampling")  # the GET was on the call's member session
    assert {x.request_header("mcp-session-id") for x in gets} == \
        {call.headers["mcp-session-id"]}


async def test_a_change_of_members_is_announced_on_the_get_stream() -> None:
    changed: list[Any] = []

    async def on_message(message: Any) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            changed.append(message)

    async with team() as t:
        async with connect(t.url):  # the gateway is serving: its management API is built
            pass
        assert t.state.api is not None
        endpoints = t.state.api.endpoints
        assert endpoints is not None
        await endpoints.create(EndpointIn(name="crew", members=["alpha", "talker"]))
        crew = t.url.replace("/mcp/team", "/mcp/crew")
        async with connect(crew, message_handler=on_message) as client:
            await until(t.get_open, what="the member's GET stream to open")
            assert "talker__chatter" in {x.name for x in (await client.list_tools()).tools}
            assert not changed
            await endpoints.patch("crew", {"members": ["alpha"]})  # as PATCH /api/v1 does
            await until(lambda: changed, what="list_changed on the GET stream")
            assert "talker__chatter" not in {x.name for x in (await client.list_tools()).tools}


async def test_members_that_join_or_leave_are_followed_by_an_open_get_stream() -> None:
    alpha_app, alpha = stateful_sse_app()
    beta_app, beta = stateful_sse_app()
    db = db_backends.url()
    _, secret = api_keys.create(db, "ci", [], role="admin")
    auth = {"Authorization": f"Bearer {secret}"}
    changed: list[Any] = []
    answered: list[Any] = []

    async def on_message(message: Any) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            changed.append(message)

    async def on_sampling(ctx: Any, params: types.CreateMessageRequestParams
                          ) -> types.CreateMessageResult:
        answered.append(ctx.request_id)
        return types.CreateMessageResult(role="assistant", model="test", content=types.TextContent(
            type="text", text=f"sampled: {params.messages[0].content.text}"))

    def streams(probe: UpstreamProbe) -> list[Any]:
        return [x for x in probe.exchanges if x.method == "GET" and x.status == 200]

    async with AsyncExitStack() as stack:
        site = await stack.enter_async_context(gateway_stack(
            lambda urls: {"auth": {"mode": "jwt"}, "upstreams": legacy(urls)},
            upstreams={"alpha": alpha_app, "beta": beta_app},
            client={"headers": auth, "timeout": DEADLINE_S}))
        gw, admin = site.url, site.client
        created = await admin.post(f"{gw}/api/v1/endpoints",
                                   json={"name": "crew", "members": ["alpha"]})
        assert created.status_code == 201, created.text
        client = await stack.enter_async_context(connect(
            f"{gw}/mcp/crew", headers=auth, message_handler=on_message,
            sampling_callback=on_sampling, read_timeout_seconds=DEADLINE_S))
        await until(lambda: streams(alpha), what="alpha's GET stream to open")
        assert not streams(beta)

        joined = await admin.patch(f"{gw}/api/v1/endpoints/crew",
                                   json={"members": ["alpha", "beta"]})
        assert joined.status_code == 200, joined.text
        await until(lambda: changed, what="list_changed on the GET stream")
        await until(lambda: streams(beta), what="the joined member's GET stream to open")
        # beta asks on its GET stream (no call to relate it to): it reaches the client there,
        # and the client's answer reaches beta under beta's own id
        result = await client.call_tool("beta__ask_sampling", {"prompt": "joined",
                                                               "standalone": True})
        assert result.content[0].text == "sampled: joined"
        (listened,) = streams(beta)
        (call,) = beta.tool_calls("ask_sampling")
        assert listened.request_header("mcp-session-id") == call.headers["mcp-session-id"]
        assert len(answered) == 1 and str(answered[0]).startswith("tv1.")
        assert not any(str(x["id"]).startswith("tv1.") for x in answers_posted(beta))

        left = await admin.patch(f"{gw}/api/v1/endpoints/crew", json={"members": ["alpha"]})
        assert left.status_code == 200, left.text
        await until(lambda: len(changed) >= 2, what="list_changed for the member that left")
        await until(lambda: listened.done, what="the left member's GET stream to close")
        assert not any(x.done for x in streams(alpha))  # the other member is still heard


# an event that outgrows the 256 KiB head it is judged by before it ends (the upstream transport
# hands over at most ~192 KiB a read), in a call whose own request stays under 1 MiB (past it
# aiohttp warns of a large raw body, which the suite's warnings-as-errors fails)
BIG = 768 * 1024


async def test_a_request_larger_than_the_head_is_viewed_and_answered() -> None:
    asked: list[tuple[Any, int]] = []

    async def on_sampling(ctx: Any, params: types.CreateMessageRequestParams
                          ) -> types.CreateMessageResult:
        asked.append((ctx.request_id, len(params.messages[0].content.text)))
        return types.CreateMessageResult(role="assistant", model="test", content=types.TextContent(
            type="text", text="short"))

    async with team() as t, connect(t.url, sampling_callback=on_sampling,
                                    read_timeout_seconds=DEADLINE_S) as client:
        result = await client.call_tool("alpha__ask_sampling", {"prompt": "p" * BIG})
        assert result.content[0].text == "short"
    ((rid, size),) = asked
    assert str(rid).startswith("tv1.") and size == BIG  # sealed: the whole event was viewed
    (answer,) = answers_posted(t.alpha)
    assert not str(answer["id"]).startswith("tv1.")


async def test_a_notice_larger_than_the_head_names_its_member_on_an_unheld_stream() -> None:
    logs: list[types.LoggingMessageNotificationParams] = []

    async def on_log(params: types.LoggingMessageNotificationParams) -> None:
        logs.append(params)

    server = MCPServer("loud", version="1.0.0")

    @server.tool()
    async def shout(size: int, ctx: Context) -> str:
        """Log `size` characters on the call's stream, then answer."""
        await ctx.request_context.session.send_notification(types.LoggingMessageNotification(
            params=types.LoggingMessageNotificationParams(level="info", logger="db",
                                                          data="l" * size)),
            related_request_id=ctx.request_id)
        return "done"

    async with AsyncExitStack() as stack:
        site = await stack.enter_async_context(gateway_stack(
            lambda urls: {"upstreams": [{"name": "loud", "url": f"{urls.upstream}/mcp",
                                         "era": "modern"}],
                          "endpoints": [{"name": "team", "members": ["loud"]}]},
            upstream=server.streamable_http_app(streamable_http_path="/mcp")))
        # a 2026-07-28 client on a 2026-07-28 member, no policy rewriting: nothing holds the
        # answer, and the member's log, past the head, is still held to be named
        client = await stack.enter_async_context(Client(site.endpoint("team"), mode=MODERN,
                                                        logging_callback=on_log))
        result = await client.call_tool("loud__shout", {"size": BIG})
        assert result.content[0].text == "done"
        await until(lambda: logs, what="the member's log")
    assert [(x.logger, len(x.data)) for x in logs] == [("loud/db", BIG)]


async def test_a_request_past_the_hold_limit_ends_the_call() -> None:
    app, probe = stateful_sse_app()

    async def on_sampling(ctx: Any, params: Any) -> types.CreateMessageResult:
        raise AssertionError("no request this large reaches the client")

    async with AsyncExitStack() as stack:
        site = await stack.enter_async_context(gateway_stack(
            lambda urls: {"server": {"max_response_bytes": BIG // 2},
                          "upstreams": legacy(urls),
                          "endpoints": [{"name": "team", "members": ["alpha"]}]},
            upstreams={"alpha": app}))
        client = await stack.enter_async_context(connect(
            site.endpoint("team"), sampling_callback=on_sampling, read_timeout_seconds=DEADLINE_S))
        with pytest.raises(MCPError) as ended:
            await client.call_tool("alpha__ask_sampling", {"prompt": "p" * BIG})
    assert ended.value.error.code == -32000
    assert "max_response_bytes" in ended.value.error.message
    assert not answers_posted(probe)
