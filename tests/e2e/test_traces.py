"""Traces (docs/operations.md, "Traces"): the gateway on Hypercorn with tracing on, its spans in
the SDK's in-memory exporter (through the real BatchSpanProcessor), the official SDK client in
front and a real upstream behind that records the `traceparent` header and `params._meta` it
receives; and one gateway whose OTLP/HTTP exporter posts to a local receiver."""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from proxy.audit import query
from proxy.config import ConfigError, from_dict
from proxy.observability.tracing import traces_url
from tests.e2e.conftest import Stack, open_stack
from tests.e2e.sdk_client import connect
from tests.e2e.upstreams import Exchange, stateful_sse_app, stateless_json_app
from tests.helpers import until
from tests.servers import serve

TRACING = {"observability": {"otlp_endpoint": "http://127.0.0.1:9/"}}  # spans: the exporter
HEADER_TRACE, HEADER_SPAN = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
HEADER_TP = f"00-{HEADER_TRACE}-{HEADER_SPAN}-01"
META_TRACE, META_SPAN = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
META_TP = f"00-{META_TRACE}-{META_SPAN}-01"
MODERN = "2026-07-28"


@asynccontextmanager
async def traced(tmp_path: Path, make: Any, config: dict[str, Any] | None = None,
                 **upstream: Any) -> AsyncIterator[tuple[Stack, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    async with open_stack(tmp_path, make, config={**TRACING, **(config or {})},
                          span_exporter=exporter, **upstream) as stack:
        yield stack, exporter


async def spans(stack: Stack, exporter: InMemorySpanExporter, *names: str
                ) -> Sequence[ReadableSpan]:
    """Every span exported once each of `names` has ended (a stream's ends after its answer);
    the batch processor is flushed on each poll, off the loop."""
    tracing = stack.state.tracing
    assert tracing is not None

    async def ended() -> bool:
        await asyncio.to_thread(tracing.force_flush)
        done = [s.name for s in exporter.get_finished_spans()]
        return all(n in done for n in names)

    await until(ended, what=f"spans {names}")
    return exporter.get_finished_spans()


def one(found: Sequence[ReadableSpan], name: str, kind: SpanKind) -> ReadableSpan:
    matching = [s for s in found if s.name == name and s.kind is kind]
    assert len(matching) == 1, [(s.name, s.kind) for s in found]
    return matching[0]


def upstream_call(exchanges: list[Exchange], tool: str) -> Exchange:
    (exchange,) = [e for e in exchanges if e.rpc_method == "tools/call"
                   and e.rpc["params"]["name"] == tool]
    return exchange


def carried(span: ReadableSpan) -> str:
    ctx = span.get_span_context()
    assert ctx is not None
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-01"


async def test_a_tool_call_is_a_server_span_and_its_upstream_leg_a_client_span(
        tmp_path: Path) -> None:
    async with traced(tmp_path, stateful_sse_app) as (stack, exporter):
        async with connect(stack.endpoint, headers={"traceparent": HEADER_TP}) as client:
            session_id = client.session_id
            assert session_id is not None
            result = await client.call_tool("echo", {"text": "traced"})
            assert result.content[0].text == "traced"
            found = await spans(stack, exporter, "tools/call echo")
        server = one(found, "tools/call echo", SpanKind.SERVER)
        client_span = one(found, "tools/call echo", SpanKind.CLIENT)
        # the parent: the caller's traceparent header (no _meta one)
        assert server.parent is not None and server.parent.is_remote
        assert (f"{server.parent.trace_id:032x}", f"{server.parent.span_id:016x}") == (
            HEADER_TRACE, HEADER_SPAN)
        attrs = dict(server.attributes or {})
        assert attrs["mcp.method.name"] == "tools/call"
        assert attrs["gen_ai.tool.name"] == "echo"
        assert attrs["gen_ai.operation.name"] == "execute_tool"
        assert attrs["mcp.protocol.version"] == "2025-11-25"
        assert attrs["jsonrpc.request.id"] == str(
            upstream_call(stack.probe.exchanges, "echo").rpc["id"])
        assert "error.type" not in attrs and server.status.status_code is StatusCode.UNSET
        # the session: the audit's hash, never the id
        await until(lambda: any(r["tool"] == "echo" for r in query(stack.db_path, limit=20)))
        (record,) = [r for r in query(stack.db_path, limit=20) if r["tool"] == "echo"]
        assert attrs["mcp.session.id"] == record["session_hash"] != session_id
        assert all(session_id not in s.to_json() for s in found)
        # the CLIENT span: a child of the SERVER span, and the context the upstream received
        assert client_span.parent is not None
        assert client_span.parent.span_id == server.context.span_id
        assert client_span.context.trace_id == server.context.trace_id == int(HEADER_TRACE, 16)
        cattrs = dict(client_span.attributes or {})
        assert cattrs["mcp.method.name"] == "tools/call" and cattrs["gen_ai.tool.name"] == "echo"
        assert cattrs["server.address"] == "127.0.0.1" and isinstance(cattrs["server.port"], int)
        sent = upstream_call(stack.probe.exchanges, "echo")
        assert sent.request_header("traceparent") == carried(client_span)
        assert sent.rpc["params"]["_meta"]["traceparent"] == carried(client_span)
        assert sent.rpc["params"]["arguments"] == {"text": "traced"}
        # the spans of the other messages: initialize (its session's hash at its end too)
        init = one(found, "initialize", SpanKind.SERVER)
        assert dict(init.attributes or {})["mcp.session.id"] == record["session_hash"]
        # a notification sent on: its own CLIENT span, its context carried, still no id
        one(found, "notifications/initialized", SpanKind.SERVER)
        note = one(found, "notifications/initialized", SpanKind.CLIENT)
        (sent_note,) = stack.probe.posts("notifications/initialized")
        assert sent_note.request_header("traceparent") == carried(note)
        assert sent_note.rpc["params"]["_meta"]["traceparent"] == carried(note)
        assert "id" not in sent_note.rpc
        assert "jsonrpc.request.id" not in dict(note.attributes or {})


async def test_the_meta_context_is_the_parent_and_the_headers_a_link(tmp_path: Path) -> None:
    async with traced(tmp_path, stateless_json_app) as (stack, exporter):
        async with connect(stack.endpoint, headers={"traceparent": HEADER_TP}) as client:
            await client.call_tool("echo", {"text": "x"},
                                   meta={"traceparent": META_TP, "tracestate": "rojo=1",
                                         "baggage": "tenant=blue", "vendor.example/k": "v"})
            found = await spans(stack, exporter, "tools/call echo")
        server = one(found, "tools/call echo", SpanKind.SERVER)
        assert server.parent is not None
        assert (server.parent.trace_id, server.parent.span_id) == (int(META_TRACE, 16),
                                                                  int(META_SPAN, 16))
        assert [(link.context.trace_id, link.context.span_id) for link in server.links] == [
            (int(HEADER_TRACE, 16), int(HEADER_SPAN, 16))]
        client_span = one(found, "tools/call echo", SpanKind.CLIENT)
        meta = upstream_call(stack.probe.exchanges, "echo").rpc["params"]["_meta"]
        # the gateway's own context replaces the caller's; the rest of _meta goes on
        assert meta["traceparent"] == carried(client_span)
        assert meta["tracestate"] == "rojo=1" and meta["baggage"] == "tenant=blue"
        assert meta["vendor.example/k"] == "v"


async def test_policy_decisions_are_events_of_the_server_span(tmp_path: Path) -> None:
    async with traced(tmp_path, stateless_json_app, access={"tools_deny": ["boom"]}) as (
            stack, exporter), connect(stack.endpoint) as client:
        await client.call_tool("echo", {"text": "allowed"})
        with pytest.raises(MCPError):
            await client.call_tool("boom", {})
        found = await spans(stack, exporter, "tools/call echo", "tools/call boom")
    names = stack.gateway.chain.names
    allowed = one(found, "tools/call echo", SpanKind.SERVER)
    assert [(e.name, dict(e.attributes or {})["tollhouse.policy.name"],
             dict(e.attributes or {})["tollhouse.policy.decision"]) for e in allowed.events] == [
        ("tollhouse.policy.decision", n, "allow") for n in names]
    denied = one(found, "tools/call boom", SpanKind.SERVER)
    decisions = [dict(e.attributes or {}) for e in denied.events]
    assert decisions[-1]["tollhouse.policy.name"] == "access"
    assert decisions[-1]["tollhouse.policy.decision"] == "deny"
    assert decisions[-1]["error.type"] == dict(denied.attributes or {})["error.type"]
    assert all(d["tollhouse.policy.decision"] == "allow" for d in decisions[:-1])
    assert len(decisions) == names.index("access") + 1  # no policy after the denial ran
    assert denied.status.status_code is StatusCode.ERROR
    assert dict(denied.attributes or {})["rpc.response.status_code"].startswith("-")
    # a denied call never reached the upstream: no CLIENT span, no upstream request
    assert not [s for s in found if s.name == "tools/call boom" and s.kind is SpanKind.CLIENT]
    assert not [e for e in stack.probe.exchanges if e.rpc_method == "tools/call"
                and e.rpc["params"]["name"] == "boom"]


async def test_a_bridged_call_carries_the_context_to_the_legacy_upstream(
        tmp_path: Path) -> None:
    async with traced(tmp_path, stateful_sse_app, era="legacy") as (stack, exporter), \
            Client(stack.endpoint, mode=MODERN) as client:
        result = await client.call_tool("echo", {"text": "bridged"},
                                        meta={"traceparent": META_TP})
        assert result.content[0].text == "bridged"
        found = await spans(stack, exporter, "tools/call echo")
    server = one(found, "tools/call echo", SpanKind.SERVER)
    client_span = one(found, "tools/call echo", SpanKind.CLIENT)
    assert server.parent is not None and server.parent.trace_id == int(META_TRACE, 16)
    attrs = dict(server.attributes or {})
    assert attrs["mcp.protocol.version"] == MODERN
    assert "mcp.session.id" not in attrs  # a 2026-07-28 call has no session
    assert dict(client_span.attributes or {})["mcp.protocol.version"] == "2025-11-25"
    sent = upstream_call(stack.probe.exchanges, "echo")
    assert sent.request_header("mcp-protocol-version") == "2025-11-25"
    assert sent.request_header("traceparent") == carried(client_span)
    meta = sent.rpc["params"]["_meta"]
    assert meta["traceparent"] == carried(client_span)
    assert not [k for k in meta if k.startswith("io.modelcontextprotocol/")]  # still bridged


async def test_a_legacy_call_bridged_to_a_modern_upstream_carries_the_context(
        tmp_path: Path) -> None:
    async with traced(tmp_path, stateless_json_app, era="modern") as (stack, exporter), \
            connect(stack.endpoint, headers={"traceparent": HEADER_TP}) as client:
        assert (await client.call_tool("echo", {"text": "up"})).content[0].text == "up"
        found = await spans(stack, exporter, "tools/call echo")
    server = one(found, "tools/call echo", SpanKind.SERVER)
    client_span = one(found, "tools/call echo", SpanKind.CLIENT)
    assert server.parent is not None and server.parent.trace_id == int(HEADER_TRACE, 16)
    assert "mcp.session.id" in dict(server.attributes or {})  # the gateway's own session
    assert dict(client_span.attributes or {})["mcp.protocol.version"] == MODERN
    sent = upstream_call(stack.probe.exchanges, "echo")
    assert sent.request_header("mcp-protocol-version") == MODERN
    assert sent.request_header("traceparent") == carried(client_span)
    meta = sent.rpc["params"]["_meta"]
    assert meta["traceparent"] == carried(client_span)
    assert meta["io.modelcontextprotocol/protocolVersion"] == MODERN  # still enveloped


async def test_the_request_log_line_has_the_span_trace_id(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    async with traced(tmp_path, stateless_json_app) as (stack, exporter):
        with caplog.at_level(logging.INFO, logger="tollhouse.request"):
            async with connect(stack.endpoint) as client:  # no traceparent: a new trace
                await client.call_tool("echo", {"text": "logged"})
            found = await spans(stack, exporter, "tools/call echo")
    server = one(found, "tools/call echo", SpanKind.SERVER)
    assert server.parent is None
    lines = [r.getMessage() for r in caplog.records if r.name == "tollhouse.request"
             and "tool=echo" in r.getMessage()]
    assert len(lines) == 1 and f"trace_id={server.context.trace_id:032x} " in lines[0]


async def test_off_there_are_no_spans_and_nothing_is_injected(tmp_path: Path) -> None:
    async with open_stack(tmp_path, stateful_sse_app) as stack:
        assert stack.state.tracing is None
        async with connect(stack.endpoint, headers={"traceparent": HEADER_TP}) as client:
            await client.call_tool("echo", {"text": "plain"})
        sent = upstream_call(stack.probe.exchanges, "echo")
        assert all(e.request_header("traceparent") is None for e in stack.probe.exchanges)
        assert "traceparent" not in json.dumps(sent.rpc)


OFF_IMPORTS = """
import asyncio, sys
from proxy.runtime.app import create_app
from proxy.config import from_dict

async def main():
    cfg = from_dict({"database": {"url": sys.argv[1]},
                     "upstreams": [{"name": "up", "url": "http://up.test/mcp"}]}, env={})
    app = create_app(cfg)
    async with app.test_app():
        assert app.extensions["tollhouse"].gateway is not None
    # (redis-py imports the SDK's metrics when the SDK is installed: not the gateway's doing)
    print(sorted(m for m in sys.modules if m.startswith((
        "opentelemetry.sdk.trace", "opentelemetry.exporter", "proxy.observability.tracing"))))

asyncio.run(main())
"""


async def test_off_no_tracer_or_exporter_is_imported(tmp_path: Path) -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", OFF_IMPORTS, f"sqlite:///{tmp_path}/off.db",
        cwd=Path(__file__).resolve().parents[2], stdout=asyncio.subprocess.PIPE)
    out, _ = await process.communicate()
    assert process.returncode == 0
    assert out.decode().strip() == "[]"


async def test_off_a_callers_meta_is_passed_through_untouched(tmp_path: Path) -> None:
    async with open_stack(tmp_path, stateless_json_app) as stack:
        async with connect(stack.endpoint) as client:
            await client.call_tool("echo", {"text": "x"}, meta={"traceparent": META_TP})
        sent = upstream_call(stack.probe.exchanges, "echo")
        assert sent.rpc["params"]["_meta"]["traceparent"] == META_TP
        assert sent.request_header("traceparent") is None


async def test_the_otlp_http_exporter_posts_to_the_configured_endpoint(tmp_path: Path) -> None:
    posts: list[tuple[str, str, int]] = []

    async def receiver(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        headers = dict(scope["headers"])
        posts.append((scope["path"], headers.get(b"content-type", b"").decode(), len(body)))
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/x-protobuf")]})
        await send({"type": "http.response.body", "body": b""})

    async with serve(receiver, graceful_timeout=1) as collector:
        config = {"observability": {"otlp_endpoint": collector}}
        async with open_stack(tmp_path, stateless_json_app, config=config) as stack:
            async with connect(stack.endpoint) as client:
                await client.call_tool("echo", {"text": "exported"})
            tracing = stack.state.tracing
            assert tracing is not None

            async def posted() -> bool:
                await asyncio.to_thread(tracing.force_flush)
                return bool(posts)

            await until(posted, what="a POST to the collector")
    path, ctype, size = posts[0]
    assert (path, ctype) == ("/v1/traces", "application/x-protobuf") and size > 0


def test_tracing_without_the_extra_is_a_one_line_config_error(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "opentelemetry.exporter.otlp.proto.http.trace_exporter",
                        None)
    with pytest.raises(ConfigError) as caught:
        from_dict({"observability": {"otlp_endpoint": "http://collector:4318"}}, env={})
    message = str(caught.value)
    assert "'observability.otlp_endpoint'" in message and "tollhouse[otel]" in message
    assert "\n" not in message
    from_dict({"observability": {"otlp_endpoint": ""}}, env={})  # off: no extra needed


def test_the_traces_url_of_an_endpoint() -> None:
    assert traces_url("http://collector:4318") == "http://collector:4318/v1/traces"
    assert traces_url("http://collector:4318/") == "http://collector:4318/v1/traces"
    assert traces_url("https://otel.example/v1/traces") == "https://otel.example/v1/traces"
    with pytest.raises(ConfigError):
        from_dict({"observability": {"otlp_endpoint": "not a url"}}, env={})

