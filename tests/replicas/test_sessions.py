"""Item 1: two replicas behind a round-robin load balancer with no stickiness behave as one
gateway. The official SDK client runs a 2025-11-25 session through HAProxy; HAProxy's log
shows which replica served each request of it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from mcp import types

from tests.e2e.sdk_client import connect
from tests.helpers import until
from tests.replicas.conftest import Upstream
from tests.replicas.harness import Cluster, Served

ATTEMPTS = 6  # round-robin alternates, so a crossing is all but certain on the first


async def test_one_session_continues_through_either_replica(cluster: Cluster,
                                                            upstream: Upstream) -> None:
    async with connect(cluster.endpoint) as client:
        assert {"echo", "wait_forever"} <= {t.name for t in (await client.list_tools()).tools}
        for i in range(6):
            result = await client.call_tool("echo", {"text": f"call {i}"})
            assert result.content[0].text == f"call {i}"
        await until(lambda: any(s.method == "GET" for s in cluster.of_session(client.session_id)),
                    what="the SDK's GET stream to open")
        served = cluster.of_session(client.session_id)
    calls = [s for s in served if s.rpc_method == "tools/call"]
    assert len(calls) == 6 and all(s.status == 200 for s in calls)
    assert {s.server for s in calls} == {"r0", "r1"}, served
    (stream,) = [s for s in served if s.method == "GET"]  # opened on one replica, stays there
    assert stream.status == 200
    # the posts around it landed on both, the other replica's included
    assert {s.server for s in served if s.method == "POST"} == {"r0", "r1"}
    # one upstream session behind the one gateway session, whichever replica forwarded
    sessions = {c.headers.get("mcp-session-id") for c in upstream.probe.tool_calls("echo")}
    assert len(sessions) == 1 and None not in sessions


def sampler(answers: list[str]) -> Any:
    async def on_sampling(ctx: Any, params: types.CreateMessageRequestParams
                          ) -> types.CreateMessageResult:
        prompt = params.messages[0].content.text  # type: ignore[union-attr]
        answers.append(f"sampled {prompt}")
        return types.CreateMessageResult(role="assistant", model="test",
                                         content=types.TextContent(type="text",
                                                                   text=f"sampled {prompt}"))
    return on_sampling


async def crossing(cluster: Cluster, ask: Callable[[int], Awaitable[None]],
                   raised: Callable[[Served, int], bool], reply: Callable[[int], str],
                   where_raised: Callable[[Served], str]) -> list[tuple[str, str]]:
    """Ask until the replica that raised a server-to-client request and the one the client's
    answer (the POST whose body holds `reply(k)`) landed on differ; every (raised-on,
    answered-on) pair seen, the last one crossing."""
    pairs: list[tuple[str, str]] = []
    for k in range(ATTEMPTS):
        await ask(k)
        call = await cluster.logged(lambda s, k=k: raised(s, k), f"tools/call #{k}")  # type: ignore[misc]
        response = await cluster.logged(
            lambda s, k=k: s.is_response and reply(k) in s.body, f"answer #{k}")  # type: ignore[misc]
        assert response.status == 202
        pairs.append((where_raised(call), response.server))
        if pairs[-1][0] != pairs[-1][1]:
            return pairs
    raise AssertionError(f"no answer ever landed on another replica: {pairs}")


def tool_call(name: str, key: str, text: str) -> Callable[[Served, int], bool]:
    """Matches the logged tools/call of `name` whose argument `key` is `text` with k in it."""
    def match(s: Served, k: int) -> bool:
        params = (s.rpc or {}).get("params") or {}
        return (s.rpc_method == "tools/call" and params.get("name") == name
                and params.get("arguments", {}).get(key) == text.format(k))
    return match


async def test_sampling_raised_on_one_replica_is_answered_through_the_other(
        cluster: Cluster) -> None:
    answers: list[str] = []
    async with connect(cluster.endpoint, sampling_callback=sampler(answers)) as client:
        async def ask(k: int) -> None:
            result = await client.call_tool("ask_sampling", {"prompt": f"prompt #{k}"})
            assert result.content[0].text == f"sampled prompt #{k}"

        pairs = await crossing(cluster, ask, tool_call("ask_sampling", "prompt", "prompt #{}"),
                               lambda k: f"sampled prompt #{k}", lambda s: s.server)
    assert pairs[-1][0] != pairs[-1][1]
    assert len(answers) == len(pairs)


async def test_elicitation_raised_on_one_replica_is_answered_through_the_other(
        cluster: Cluster) -> None:
    async def on_elicit(ctx: Any, params: Any) -> types.ElicitResult | types.ErrorData:
        return types.ElicitResult(action="accept", content={"answer": f"yes {params.message}"})

    async with connect(cluster.endpoint, elicitation_callback=on_elicit) as client:  # type: ignore[arg-type]
        async def ask(k: int) -> None:
            result = await client.call_tool("ask_elicitation", {"message": f"ok #{k}"})
            assert result.content[0].text == f"accept:yes ok #{k}"

        pairs = await crossing(cluster, ask, tool_call("ask_elicitation", "message", "ok #{}"),
                               lambda k: f"yes ok #{k}", lambda s: s.server)
    assert pairs[-1][0] != pairs[-1][1]


async def test_a_request_on_the_get_stream_is_answered_through_the_other_replica(
        cluster: Cluster, upstream: Upstream) -> None:
    """`standalone=True`: the upstream sends sampling/createMessage on the session's GET
    stream, which one replica holds; the client's answer must reach the upstream from
    whichever replica its POST lands on."""
    answers: list[str] = []
    async with connect(cluster.endpoint, sampling_callback=sampler(answers)) as client:
        stream = await cluster.logged(
            lambda s: s.method == "GET" and s.session_id == client.session_id and s.status == 200,
            "the SDK's GET stream")
        await until(lambda: any(ex.method == "GET" and ex.status == 200
                                for ex in upstream.probe.exchanges),
                    what="the upstream's GET stream to open")

        async def ask(k: int) -> None:
            result = await client.call_tool("ask_sampling", {"prompt": f"stream #{k}",
                                                             "standalone": True})
            assert result.content[0].text == f"sampled stream #{k}"

        pairs = await crossing(cluster, ask, tool_call("ask_sampling", "prompt", "stream #{}"),
                               lambda k: f"sampled stream #{k}", lambda s: stream.server)
    assert pairs[-1][0] == stream.server != pairs[-1][1]
