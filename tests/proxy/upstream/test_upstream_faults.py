"""Upstream failures become JSON-RPC -32000 with HTTP 200 and a short message with no upstream
body (seed 004); on a stream, the failure is the last event. respx injects the faults."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import orjson
import pytest
import respx

from tests.conftest import make_config, running_gateway

CALL = {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": "echo", "arguments": {"text": "hi"}}}
SECRET = "sk-upstream-s3cret"


class Chunks(httpx.AsyncByteStream):
    """An upstream body that yields the given chunks, then raises or ends."""

    def __init__(self, chunks: list[bytes], fail: Exception | None = None) -> None:
        self.chunks = chunks
        self.fail = fail
        self.closed = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for chunk in self.chunks:
            yield chunk
        if self.fail is not None:
            raise self.fail

    async def aclose(self) -> None:
        self.closed = True


def sse(*messages: dict) -> list[bytes]:
    return [b"event: message\r\ndata: " + orjson.dumps(m) + b"\r\n\r\n" for m in messages]


PROGRESS = {"jsonrpc": "2.0", "method": "notifications/progress",
            "params": {"progressToken": 2, "progress": 1}}
RESULT = {"jsonrpc": "2.0", "id": 2, "result": {"content": []}}


def route(side_effect: object) -> httpx.MockTransport:
    router = respx.Router()
    router.post("http://upstream.test/mcp").mock(side_effect=side_effect)
    return httpx.MockTransport(router.async_handler)


def sse_response(body: Chunks) -> httpx.Response:
    return httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=body)


@pytest.mark.parametrize(
    ("effect", "message"),
    [
        (httpx.ConnectError("refused"), "upstream unavailable"),
        (httpx.ConnectTimeout("slow dns"), "upstream timed out"),
        (httpx.ReadTimeout("idle"), "upstream timed out"),
        (httpx.RemoteProtocolError("garbage"), "upstream connection broke"),
        (httpx.Response(500, text=f"Traceback ... token={SECRET}"), "upstream answered HTTP 500"),
        (httpx.Response(401, text=SECRET), "upstream answered HTTP 401"),
        (httpx.Response(429), "upstream answered HTTP 429"),
        (httpx.Response(202), "upstream sent an unexpected content type"),
        (httpx.Response(200, text=f"<html>{SECRET}</html>",
                        headers={"content-type": "text/html"}),
         "upstream sent an unexpected content type"),
        (httpx.Response(200, text=f"not json {SECRET}",
                        headers={"content-type": "application/json"}),
         "upstream sent an invalid MCP response"),
        (httpx.Response(200, json={"jsonrpc": "2.0", "id": 99, "result": {}}),
         "upstream sent an invalid MCP response"),
        (httpx.Response(200, json=[1, 2]), "upstream sent an invalid MCP response"),
        # found by the relay fuzz target: no answer a client takes for its call's (id 2)
        (httpx.Response(200, json={"jsonrpc": "2.0", "id": 2}),
         "upstream sent an invalid MCP response"),
        (httpx.Response(200, json={"jsonrpc": "2.0", "id": 2, "result": {}, "error": {}}),
         "upstream sent an invalid MCP response"),
        (httpx.Response(200, json={"jsonrpc": "2.0", "id": 2.0, "result": {}}),
         "upstream sent an invalid MCP response"),
    ],
)
async def test_upstream_failure_is_32000_with_http_200(effect: object, message: str) -> None:
    async with running_gateway(make_config(), route(effect)) as gw:
        response = await gw.post(CALL)
        assert response.status_code == 200
        assert response.json() == {"jsonrpc": "2.0", "id": 2,
                                   "error": {"code": -32000, "message": message}}
        assert SECRET not in response.text
        (record,) = await gw.audit.wait_for(1)
        assert (record.status, record.error_message, record.tool) == ("error", message, "echo")


async def test_upstream_jsonrpc_error_is_relayed_and_audited_as_error() -> None:
    error = {"jsonrpc": "2.0", "id": 2, "error": {"code": -32602, "message": "Unknown tool"}}
    async with running_gateway(make_config(), route(httpx.Response(200, json=error))) as gw:
        response = await gw.post(CALL)
        assert response.json() == error
        (record,) = await gw.audit.wait_for(1)
        assert (record.status, record.error_message) == ("error", "upstream error -32602")


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (Chunks(sse(PROGRESS), httpx.ReadError("reset")), "upstream connection broke"),
        (Chunks(sse(PROGRESS)), "upstream stream ended before the response"),
        (Chunks([*sse(PROGRESS), b"data: {not json\n\n"]), "upstream sent an invalid MCP response"),
        (Chunks([*sse(PROGRESS), b"event: message\ndata: {\"jsonrpc\""]),
         "upstream stream ended before the response"),
        # found by the relay fuzz target: the call's id, but neither result nor error (or an id
        # of another type), was taken as the answer and the client was left with none
        (Chunks(sse(PROGRESS, {"jsonrpc": "2.0", "id": 2, "erroror": {}})),
         "upstream stream ended before the response"),
        (Chunks(sse(PROGRESS, {"jsonrpc": "2.0", "id": 2.0, "result": {}})),
         "upstream stream ended before the response"),
    ],
)
async def test_a_stream_cut_mid_call_ends_with_one_error_event(body: Chunks, message: str
                                                               ) -> None:
    async with running_gateway(make_config(), route(sse_response(body))) as gw:
        response = await gw.post(CALL)
        assert response.status_code == 200
        events = [e for e in response.text.replace("\r\n", "\n").split("\n\n") if e]
        assert orjson.loads(events[0].split("data: ", 1)[1]) == PROGRESS
        last = orjson.loads(events[-1].split("data: ", 1)[1])
        assert last == {"jsonrpc": "2.0", "id": 2, "error": {"code": -32000, "message": message}}
        assert body.closed
        (record,) = await gw.audit.wait_for(1)
        assert (record.status, record.error_message) == ("error", message)
        assert len(gw.gateway.inflight) == 0  # type: ignore[arg-type]


async def test_a_whole_stream_is_relayed_event_by_event() -> None:
    body = Chunks([b"id: 7\r\nevent: message\r\n", *sse(PROGRESS), *sse(RESULT)])
    async with running_gateway(make_config(), route(sse_response(body))) as gw:
        response = await gw.post(CALL)
        assert response.headers["content-type"].startswith("text/event-stream")
        assert response.content == b"".join(body.chunks)  # ids, fields, CRLFs untouched
        (record,) = await gw.audit.wait_for(1)
        assert record.status == "ok" and record.bytes_out == len(response.content)


async def test_client_credentials_and_hop_by_hop_headers_stay_at_the_gateway() -> None:
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"jsonrpc": "2.0", "id": 2, "result": {}})

    cfg = make_config(upstreams=[{"name": "e", "url": "http://upstream.test/mcp",
                                  "headers": {"Authorization": "Bearer upstream-cred",
                                              "X-Tenant": "t1"}}])
    async with running_gateway(cfg, route(answer)) as gw:
        await gw.post(CALL, headers={
            "Authorization": "Bearer client-token", "Cookie": "sid=1",
            "Proxy-Authorization": "Basic x", "Connection": "keep-alive, X-Foo", "X-Foo": "1",
            "TE": "trailers", "Upgrade": "h2c", "Forwarded": "for=1.2.3.4",
            "X-Api-Key": "client-key"})
        (request,) = seen
        headers = {k.lower(): v for k, v in request.headers.items()}
        assert headers["authorization"] == "Bearer upstream-cred"
        assert headers["x-tenant"] == "t1"
        for name in ("cookie", "proxy-authorization", "x-foo", "te", "upgrade", "forwarded",
                     "x-api-key"):
            assert name not in headers
        assert headers["mcp-protocol-version"] == "2025-11-25"
        assert headers["accept"] == "application/json, text/event-stream"
        (record,) = await gw.audit.wait_for(1)
        assert "client-token" not in repr(record) and "upstream-cred" not in repr(record)


async def test_upstream_cookies_never_carry_over_between_calls() -> None:
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"jsonrpc": "2.0", "id": 2, "result": {}},
                              headers={"set-cookie": "upstream=alice-secret; Path=/"})

    async with running_gateway(make_config(), route(answer)) as gw:
        first = await gw.post(CALL)
        await gw.post(CALL)
        assert "set-cookie" not in first.headers
        assert [r.headers.get("cookie") for r in seen] == [None, None]


# -- where there is no call to answer: one-way messages, the GET stream, DELETE ----------------

ONE_WAY_FAULTS = [
    (httpx.ConnectError("refused"), "upstream unavailable"),
    (httpx.ReadTimeout("idle"), "upstream timed out"),
    (httpx.Response(500, text=f"Traceback ... token={SECRET}"), "upstream answered HTTP 500"),
    (httpx.Response(401, text=SECRET, headers={"www-authenticate": "Bearer realm=up"}),
     "upstream answered HTTP 401"),
]


def bad_gateway(response: httpx.Response, message: str) -> None:
    """2025-11-25 transport: an HTTP error status whose body is a JSON-RPC error with no id."""
    assert response.status_code == 502
    assert response.json() == {"jsonrpc": "2.0", "error": {"code": -32000, "message": message}}
    assert SECRET not in response.text
    assert "www-authenticate" not in response.headers
    assert "x-upstream" not in response.headers


@pytest.mark.parametrize(("effect", "message"), ONE_WAY_FAULTS)
@pytest.mark.parametrize("body", [
    {"jsonrpc": "2.0", "method": "notifications/initialized"},
    {"jsonrpc": "2.0", "id": "srv-1", "result": {}},  # the client's answer to a server request
], ids=["notification", "response"])
async def test_one_way_upstream_failure_is_502_without_an_id(body: dict, effect: object,
                                                             message: str) -> None:
    async with running_gateway(make_config(), route(effect)) as gw:
        bad_gateway(await gw.post(body), message)
        (record,) = await gw.audit.wait_for(1)
        assert (record.status, record.error_message) == ("error", message)
        assert record.method == body.get("method")


def get_route(effect: object, *, post: object = None) -> httpx.MockTransport:
    router = respx.Router()
    router.get("http://upstream.test/mcp").mock(side_effect=effect)
    if post is not None:
        router.post("http://upstream.test/mcp").mock(side_effect=post)
    return httpx.MockTransport(router.async_handler)


@pytest.mark.parametrize(("effect", "message"), [
    *ONE_WAY_FAULTS,
    (httpx.Response(403, headers={"x-upstream": "1"}), "upstream answered HTTP 403"),
    (httpx.Response(200, json={"a": 1}), "upstream GET stream is not text/event-stream"),
])
async def test_get_upstream_failure_is_502_and_audited(effect: object, message: str) -> None:
    async with running_gateway(make_config(), get_route(effect)) as gw:
        bad_gateway(await gw.client.get(gw.endpoint()), message)
        (record,) = await gw.audit.wait_for(1)
        assert (record.method, record.status, record.error_message) == ("GET", "error", message)


async def test_get_stream_opened_or_refused_is_audited() -> None:
    stream = Chunks(sse(PROGRESS))
    effects = [sse_response(stream), httpx.Response(405, headers={"allow": "POST"})]
    async with running_gateway(make_config(), get_route(effects)) as gw:
        opened = await gw.client.get(gw.endpoint())
        assert opened.status_code == 200 and opened.content == b"".join(stream.chunks)
        refused = await gw.client.get(gw.endpoint())
        assert refused.status_code == 405 and refused.headers["allow"] == "POST"
        modern = await gw.client.get(gw.endpoint(), headers={"MCP-Protocol-Version": "2026-07-28"})
        assert modern.status_code == 405
        first, second, third = await gw.audit.wait_for(3)
        assert (first.method, first.status) == ("GET", "ok")
        assert (second.method, second.status, second.note) == (
            "GET", "ok", "upstream offers no GET stream")
        assert (third.method, third.status, third.era) == ("GET", "error", "modern")


def session_upstream(delete: object) -> httpx.MockTransport:
    def answer(request: httpx.Request) -> httpx.Response:
        msg = orjson.loads(request.content)
        return httpx.Response(200, json={"jsonrpc": "2.0", "id": msg["id"], "result": {
            "protocolVersion": "2025-11-25", "capabilities": {},
            "serverInfo": {"name": "up", "version": "1"}}}, headers={"mcp-session-id": "UP-1"})

    router = respx.Router()
    router.post("http://upstream.test/mcp").mock(side_effect=answer)
    router.delete("http://upstream.test/mcp").mock(side_effect=delete)
    return httpx.MockTransport(router.async_handler)


INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                   "clientInfo": {"name": "t", "version": "1"}}}


async def test_delete_outcomes_are_audited() -> None:
    effects = [httpx.Response(500, text=SECRET, headers={"x-upstream": "1"}),
               httpx.ConnectError("refused"), httpx.Response(200)]
    async with running_gateway(make_config(), session_upstream(effects)) as gw:
        sid = (await gw.post(INIT)).headers["mcp-session-id"]
        session = await gw.gateway.sessions.get(sid)
        assert session is not None
        missing = await gw.client.delete(gw.endpoint())
        assert missing.status_code == 400 and missing.json()["error"]["code"] == -32600
        bad_gateway(await gw.client.delete(gw.endpoint(), headers={"Mcp-Session-Id": sid}),
                    "upstream answered HTTP 500")
        bad_gateway(await gw.client.delete(gw.endpoint(), headers={"Mcp-Session-Id": sid}),
                    "upstream unavailable")
        assert await gw.gateway.sessions.get(sid) is not None  # a failed DELETE ends nothing
        ended = await gw.client.delete(gw.endpoint(), headers={"Mcp-Session-Id": sid})
        assert ended.status_code == 200
        assert await gw.gateway.sessions.get(sid) is None
        records = (await gw.audit.wait_for(5))[1:]  # after the initialize
        assert [(r.method, r.status) for r in records] == [
            ("DELETE", "error"), ("DELETE", "error"), ("DELETE", "error"), ("DELETE", "ok")]
        assert records[0].error_message == "Invalid Request: Mcp-Session-Id header required"
        assert records[1].error_message == "upstream answered HTTP 500"
        assert records[2].error_message == "upstream unavailable"
        assert records[3].session_hash == session.id_hash
        assert records[1].session_hash == session.id_hash


# -- the upstream's own JSON-RPC error on a 4xx: its verdict on the request, relayed ----------

MODERN_CALL_HEADERS = {"MCP-Protocol-Version": "2026-07-28", "Mcp-Method": "tools/call",
                       "Mcp-Name": "echo"}
MODERN_CALL = {**CALL, "params": {**CALL["params"], "_meta": {
    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
    "io.modelcontextprotocol/clientCapabilities": {}}}}


def upstream_error(status: int, code: int, request_id: object = 2, **headers: str
                   ) -> httpx.Response:
    error = {"code": code, "message": f"upstream says {code}", "data": {"why": "because"}}
    return httpx.Response(status, headers={"x-upstream": "1", **headers},
                          json={"jsonrpc": "2.0", "id": request_id, "error": error})


@pytest.mark.parametrize(("effect", "modern", "status"), [
    (upstream_error(400, -32021), False, 400),        # missing required client capability
    (upstream_error(400, -32020), True, 400),         # an Mcp-Param-* header mismatch
    (upstream_error(400, -32602), False, 400),
    (upstream_error(404, -32601), True, 404),         # 2026-07-28 says 404 for it
    (upstream_error(404, -32601), False, 200),        # a legacy request: not the session's 404
    (upstream_error(401, -32001), False, 200),        # never the gateway's own 401
    (upstream_error(403, -32001), True, 200),
    (upstream_error(422, -32602), False, 200),
    (upstream_error(429, -32029, **{"retry-after": "7"}), False, 429),
], ids=lambda v: str(v) if not isinstance(v, httpx.Response) else f"http{v.status_code}")
async def test_an_upstream_jsonrpc_error_on_a_4xx_is_relayed(effect: httpx.Response, modern: bool,
                                                             status: int) -> None:
    era = "modern" if modern else "legacy"
    cfg = make_config(upstreams=[{"name": "e", "url": "http://upstream.test/mcp", "era": era}])
    async with running_gateway(cfg, route(effect)) as gw:
        if modern:
            response = await gw.post(MODERN_CALL, headers=MODERN_CALL_HEADERS)
        else:
            response = await gw.post(CALL)
        assert response.status_code == status, response.text
        code = effect.json()["error"]["code"]
        assert response.json() == {"jsonrpc": "2.0", "id": 2, "error": {
            "code": code, "message": f"upstream says {code}", "data": {"why": "because"}}}
        assert "x-upstream" not in response.headers
        assert response.headers.get("retry-after") == ("7" if status == 429 else None)
        (record,) = await gw.audit.wait_for(1)
        assert (record.status, record.error_message) == ("error", f"upstream error {code}")


@pytest.mark.parametrize("effect", [
    upstream_error(400, -32602, request_id=3),        # another call's id
    upstream_error(400, -32602, request_id="2"),      # "2" is not 2
    upstream_error(400, -32602, request_id=None),
    httpx.Response(400, json={"jsonrpc": "2.0", "id": 2, "result": {}}),
    httpx.Response(400, json={"jsonrpc": "2.0", "id": 2, "error": {"code": "x", "message": "m"}}),
    httpx.Response(400, json={"id": 2, "error": {"code": -32602, "message": "m"}}),
    httpx.Response(400, text='{"jsonrpc": "2.0", "id": 2, "error": {"code": -1, "message": "m"}}',
                   headers={"content-type": "text/plain"}),
    httpx.Response(400, content=b'{"jsonrpc": "2.0", "id": 2, "error": {"code": -1, "message": "'
                   + b"x" * 70_000 + b'"}}', headers={"content-type": "application/json"}),
    httpx.Response(400, text=f"Bad Request {SECRET}"),
    upstream_error(500, -32603),                      # a 5xx stays an upstream failure
], ids=["other-id", "string-id", "null-id", "result", "bad-code", "no-jsonrpc", "text-plain",
        "too-large", "text", "http500"])
async def test_a_4xx_without_a_jsonrpc_error_for_this_call_stays_32000(effect: httpx.Response
                                                                       ) -> None:
    async with running_gateway(make_config(), route(effect)) as gw:
        response = await gw.post(CALL)
        status = effect.status_code
        assert response.status_code == 200
        assert response.json() == {"jsonrpc": "2.0", "id": 2, "error": {
            "code": -32000, "message": f"upstream answered HTTP {status}"}}
        assert SECRET not in response.text


@pytest.mark.parametrize("body", [
    {"jsonrpc": "2.0", "method": "notifications/initialized"},
    {"jsonrpc": "2.0", "id": "srv-1", "result": {}},
], ids=["notification", "response"])
async def test_where_there_is_no_call_an_upstream_4xx_error_keeps_its_status(body: dict) -> None:
    effects = [httpx.Response(400, json={"jsonrpc": "2.0", "id": None, "error": {
                   "code": -32600, "message": "Bad Request: malformed"}}),
               httpx.Response(400, json={"jsonrpc": "2.0", "error": {
                   "code": -32602, "message": "no"}}),
               httpx.Response(401, json={"jsonrpc": "2.0", "id": None, "error": {
                   "code": -32001, "message": "bad token"}})]
    async with running_gateway(make_config(), route(effects)) as gw:
        first = await gw.post(body)
        assert first.status_code == 400
        assert first.json() == {"jsonrpc": "2.0", "id": None, "error": {
            "code": -32600, "message": "Bad Request: malformed"}}
        second = await gw.post(body)
        assert second.status_code == 400
        assert second.json() == {"jsonrpc": "2.0", "error": {"code": -32602, "message": "no"}}
        # the upstream refusing the gateway's credential is not the client's mistake
        bad_gateway(await gw.post(body), "upstream answered HTTP 401")
        records = await gw.audit.wait_for(3)
        assert [(r.status, r.error_message) for r in records] == [
            ("error", "upstream error -32600"), ("error", "upstream error -32602"),
            ("error", "upstream answered HTTP 401")]


async def test_get_and_delete_relay_an_upstream_4xx_error() -> None:
    refusal = {"jsonrpc": "2.0", "id": None, "error": {"code": -32600, "message": "no stream"}}
    async with running_gateway(make_config(), get_route(httpx.Response(400, json=refusal))) as gw:
        response = await gw.client.get(gw.endpoint())
        assert (response.status_code, response.json()) == (400, refusal)
    async with running_gateway(make_config(), session_upstream(
            httpx.Response(409, json=refusal))) as gw:
        sid = (await gw.post(INIT)).headers["mcp-session-id"]
        response = await gw.client.delete(gw.endpoint(), headers={"Mcp-Session-Id": sid})
        assert (response.status_code, response.json()) == (409, refusal)
        assert await gw.gateway.sessions.get(sid) is not None
