"""Metrics, the request log and the probes, end to end: the official SDK client through the
gateway (Hypercorn on loopback) to an official-SDK upstream, then a real scrape of /metrics."""

from __future__ import annotations

import asyncio
import logging
import socket
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from mcp import MCPError
from prometheus_client.parser import text_string_to_metric_families

from proxy.audit import MemoryAuditSink
from proxy.observability.logs import JsonFormatter
from tests.e2e.conftest import open_stack
from tests.e2e.sdk_client import connect
from tests.e2e.upstreams import BOOM_RPC_CODE, stateful_sse_app, stateless_json_app
from tests.helpers import jwt_auth, token
from tests.servers import serve

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE}-00f067aa0ba902b7-01"


def samples(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    """Every sample called `name` in a Prometheus text exposition, with its labels."""
    return [(dict(s.labels), s.value) for family in text_string_to_metric_families(text)
            for s in family.samples if s.name == name]


def count_of(text: str, **labels: str) -> float:
    """How many server operations with these labels the histogram counted."""
    return sum(v for got, v in samples(text, "mcp_server_operation_duration_seconds_count")
               if all(got.get(k) == want for k, want in labels.items()))


async def scrape(base: str, **kw: Any) -> httpx.Response:
    async with httpx.AsyncClient() as client:
        return await client.get(f"{base}/metrics", **kw)


@pytest.mark.parametrize("make_upstream", [stateful_sse_app, stateless_json_app])
async def test_calls_are_counted_with_bounded_labels(tmp_path: Path, make_upstream: Any) -> None:
    async with open_stack(tmp_path, make_upstream) as stack:
        async with connect(stack.endpoint) as client:
            during = (await scrape(stack.gateway_url)).text
            assert ({"era": "legacy"}, 1.0) in samples(during, "tollhouse_sessions_active")
            listed = await client.list_tools()
            assert "echo" in {t.name for t in listed.tools}
            await client.call_tool("echo", {"text": "hi"})
            await client.call_tool("echo", {"text": "again"})
            failed = await client.call_tool("boom", {})
            assert failed.is_error  # a tool that raised: isError, JSON-RPC success
            with pytest.raises(MCPError):
                await client.call_tool("boom_rpc", {})  # the upstream's own JSON-RPC error
            unknown = "no-such-tool-" + "x" * 40
            assert (await client.call_tool(unknown, {})).is_error  # the SDK's own answer
        reply = await scrape(stack.gateway_url)
        assert reply.status_code == 200
        assert reply.headers["content-type"].startswith("text/plain; version=0.0.4")
        text = reply.text
        assert count_of(text, endpoint="up", mcp_method_name="tools/call",
                        gen_ai_tool_name="echo", error_type="") == 2
        assert count_of(text, mcp_method_name="tools/call", gen_ai_tool_name="boom",
                        error_type="tool_error") == 1
        assert count_of(text, mcp_method_name="tools/call", gen_ai_tool_name="_OTHER",
                        error_type="tool_error") == 1
        assert count_of(text, mcp_method_name="tools/call", gen_ai_tool_name="boom_rpc",
                        error_type=str(BOOM_RPC_CODE)) == 1
        assert unknown not in text  # an unlisted name is never a label value
        assert count_of(text, mcp_method_name="initialize", error_type="") == 1
        assert count_of(text, mcp_method_name="tools/list") == 1
        # the upstream leg of each call that reached the upstream
        legs = sum(v for labels, v in samples(text, "mcp_client_operation_duration_seconds_count")
                   if labels["mcp_method_name"] == "tools/call")
        assert legs == 5
        in_flight = samples(text, "tollhouse_calls_in_flight")
        assert in_flight and all(v == 0 for _, v in in_flight)
        assert samples(text, "tollhouse_database_up") == [({}, 1.0)]
        # the client's DELETE on the way out ended the one session
        assert samples(text, "mcp_server_session_duration_seconds_count") == [
            ({"endpoint": "up"}, 1.0)]
        assert count_of(text, mcp_method_name="DELETE", error_type="") == 1


async def test_denials_and_refusals_are_counted_by_policy_and_reason(tmp_path: Path) -> None:
    config = {"auth": jwt_auth(), "rate_limits": [
        {"name": "slow", "key": "principal", "rate": "1/h", "methods": ["tools/call"]}]}
    async with open_stack(tmp_path, stateless_json_app, config=config) as stack:
        good = {"Authorization": f"Bearer {token(endpoint='up')}"}
        async with httpx.AsyncClient() as http:
            refused = await http.post(stack.endpoint, content=b"{}", headers={
                "Content-Type": "application/json", "Accept": "application/json, "
                "text/event-stream"})
            assert refused.status_code == 401
        async with connect(stack.endpoint, headers=good) as client:
            await client.call_tool("echo", {"text": "one"})
            with pytest.raises(MCPError):
                await client.call_tool("echo", {"text": "two"})
        text = (await scrape(stack.gateway_url)).text
        denials = {(labels["policy"], labels["reason"]): v
                   for labels, v in samples(text, "tollhouse_denials_total")}
        assert denials == {("auth", "unauthenticated"): 1, ("rate_limit", "rate_limited"): 1}
        assert samples(text, "tollhouse_rate_limit_refusals_total") == [({"endpoint": "up"}, 1)]
        assert count_of(text, mcp_method_name="tools/call", error_type="-32000") == 1


async def test_metrics_answer_loopback_only_and_want_the_token(tmp_path: Path) -> None:
    secret = "metrics-token-" + "s" * 20
    config = {"observability": {"metrics_token": secret}}
    async with open_stack(tmp_path, stateless_json_app, config=config) as stack:
        missing = await scrape(stack.gateway_url)
        assert missing.status_code == 401
        assert missing.json()["error"] == "unauthorized"
        assert missing.headers["www-authenticate"].startswith("Bearer")
        wrong = await scrape(stack.gateway_url,
                             headers={"Authorization": f"Bearer {secret[:-1]}x"})
        assert wrong.status_code == 401
        assert secret not in wrong.text
        right = await scrape(stack.gateway_url, headers={"Authorization": f"Bearer {secret}"})
        assert right.status_code == 200 and "mcp_server_operation_duration_seconds" in right.text


@pytest.mark.parametrize(("public", "status"), [(False, 403), (True, 200)])
async def test_a_scrape_from_elsewhere_needs_metrics_public(tmp_path: Path, public: bool,
                                                            status: int) -> None:
    from proxy.runtime.app import create_app
    from tests.e2e.conftest import stack_config

    cfg = stack_config("http://127.0.0.1:9", f"sqlite:///{tmp_path / 'g.db'}",
                       {"observability": {"metrics_public": public}})
    app = create_app(cfg)
    async with app.test_app() as running:
        client = running.test_client()
        far = await client.get("/metrics", scope_base={"client": ("10.1.2.3", 40000)})
        near = await client.get("/metrics", scope_base={"client": ("127.0.0.1", 40000)})
        forged = await client.get("/metrics", scope_base={"client": ("10.1.2.3", 40000)},
                                  headers={"X-Forwarded-For": "127.0.0.1"})
    assert far.status_code == status and forged.status_code == status
    assert near.status_code == 200
    if not public:
        assert (await far.get_json())["error"] == "forbidden"


async def test_metrics_off_answers_404(tmp_path: Path) -> None:
    async with open_stack(tmp_path, stateless_json_app,
                          config={"observability": {"metrics": False}}) as stack:
        async with connect(stack.endpoint) as client:
            await client.call_tool("echo", {"text": "hi"})
        assert (await scrape(stack.gateway_url)).status_code == 404
        assert stack.state.metrics is None


async def test_one_log_line_per_request_with_no_secret(tmp_path: Path,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    bearer = token(endpoint="up", sub="carol")
    async with open_stack(tmp_path, stateful_sse_app, config={"auth": jwt_auth()}) as stack:
        with caplog.at_level(logging.INFO, logger="tollhouse.request"):
            async with connect(stack.endpoint, headers={
                    "Authorization": f"Bearer {bearer}", "traceparent": TRACEPARENT}) as client:
                await client.call_tool("echo", {"text": "hi"})
                session_id = client.session_id
            async with httpx.AsyncClient() as http:
                refused = await http.post(stack.endpoint, content=b"{}", headers={
                    "Content-Type": "application/json",
                    "Accept": "application/json, text/event-stream",
                    "Authorization": "Bearer not-a-valid-token-SECRETISH"})
                assert refused.status_code == 401
                nowhere = await http.post(f"{stack.gateway_url}/mcp/no%0Asuch", content=b"{}")
                assert nowhere.status_code == 404
    assert session_id
    lines = [r for r in caplog.records if r.name == "tollhouse.request"]
    text = "\n".join(r.getMessage() for r in lines)
    calls = [line for line in text.splitlines() if "method=tools/call" in line]
    assert len(calls) == 1, text
    line = calls[0]
    for field in ("request_id=", f"trace_id={TRACE}", "endpoint=up", "status=ok",
                  "http_status=200", "duration_ms="):
        assert field in line, line
    assert any("status=denied" in x and "http_status=401" in x for x in text.splitlines())
    assert any("method=initialize" in x for x in text.splitlines())
    assert any("method=DELETE" in x for x in text.splitlines())
    # an endpoint that does not exist: its line, the caller's newline quoted, not obeyed
    assert any('endpoint="no\\nsuch" method=POST' in x and "http_status=404" in x
               for x in text.splitlines()), text
    everything = caplog.text + text
    for secret in (bearer, session_id, "SECRETISH", "carol"):
        assert secret not in everything


async def test_json_log_lines(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    async with open_stack(tmp_path, stateless_json_app,
                          config={"observability": {"log_format": "json"}}) as stack:
        with caplog.at_level(logging.INFO, logger="tollhouse.request"):
            async with connect(stack.endpoint, headers={"traceparent": TRACEPARENT}) as client:
                await client.call_tool("echo", {"text": "hi"})
    formatted = [orjson.loads(JsonFormatter().format(r)) for r in caplog.records
                 if r.name == "tollhouse.request"]
    call = next(f for f in formatted if f.get("method") == "tools/call")
    assert call["trace_id"] == TRACE and call["endpoint"] == "up" and call["status"] == "ok"
    assert call["http_status"] == 200 and call["tool"] == "echo"
    assert isinstance(call["duration_ms"], float) and call["request_id"]
    assert call["level"] == "INFO" and call["logger"] == "tollhouse.request"


async def test_healthz_and_readyz(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from proxy.observability import health as health_module
    from proxy.storage import migrations

    audit = MemoryAuditSink()
    async with open_stack(tmp_path, stateless_json_app, audit=audit) as stack, \
            httpx.AsyncClient(base_url=stack.gateway_url) as http:
        assert (await http.get("/healthz")).json() == {"status": "ok"}
        ready = await http.get("/readyz")
        assert ready.status_code == 200 and ready.json() == {"status": "ready"}
        health = stack.state.health
        assert health is not None

        probes = 0
        real = migrations.current

        def counted(database: Any) -> int:
            nonlocal probes
            probes += 1
            return real(database) - 1  # one migration behind

        monkeypatch.setattr(migrations, "current", counted)
        monkeypatch.setattr(health_module, "CACHE_S", 3600.0)  # however slow the machine
        health._last = None  # the cached verdict forgotten: the next /readyz probes
        storm = await asyncio.gather(*(http.get("/readyz") for _ in range(40)))
        assert {r.status_code for r in storm} == {503}
        assert storm[0].json() == {"status": "unavailable", "down": ["migrations"]}
        assert probes == 1  # forty probes, one database round trip

        def broken(database: Any) -> int:
            raise database.errors[0]("the database is away")  # its own driver's error

        monkeypatch.setattr(migrations, "current", broken)
        health._last = None
        down = await http.get("/readyz")
        assert down.status_code == 503 and down.json()["down"] == ["database"]
        assert "tollhouse_database_up 0.0" in (await http.get("/metrics")).text

        monkeypatch.setattr(migrations, "current", real)
        health._last = None
        serving = stack.state.serving
        assert serving is not None
        serving.draining = True  # type: ignore[attr-defined]  # what SIGTERM will set
        draining = await http.get("/readyz")
        assert draining.status_code == 503 and draining.json()["down"] == ["draining"]
        serving.draining = False  # type: ignore[attr-defined]
        assert (await http.get("/readyz")).status_code == 200
    assert audit.records == []  # no probe, no scrape is audited


async def test_readyz_names_an_unreachable_redis(tmp_path: Path) -> None:
    from proxy.config import from_dict
    from proxy.runtime.app import create_app

    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()  # nothing listens there now
    cfg = from_dict({"database": {"url": f"sqlite:///{tmp_path / 'g.db'}"},
                     "state": {"url": f"redis://127.0.0.1:{port}/0", "timeout_s": 0.2},
                     "upstreams": [{"name": "up", "url": "http://127.0.0.1:9/mcp"}]}, env={})
    app = create_app(cfg)
    async with app.test_app() as running:
        reply = await running.test_client().get("/readyz")
        assert reply.status_code == 503
        assert (await reply.get_json()) == {"status": "unavailable", "down": ["state_store"]}
        scraped = await running.test_client().get(
            "/metrics", scope_base={"client": ("127.0.0.1", 40000)})
        assert "tollhouse_state_store_up 0.0" in (await scraped.get_data(as_text=True))


async def test_metering_hook_latency_and_the_outbox(tmp_path: Path) -> None:
    from tests.e2e.test_metering import Receiver, gateway, legacy_call, upstream
    from tests.helpers import until

    receiver = Receiver(usage_up=False)  # usage events wait in the outbox
    async with serve(receiver) as r_url, upstream() as (u_url, _), \
            gateway(tmp_path, r_url, u_url) as endpoint, httpx.AsyncClient() as client:
        body, headers = legacy_call("echo")
        assert (await client.post(endpoint, content=body, headers=headers)).status_code == 200
        base = endpoint.removesuffix("/mcp/up")

        async def waiting() -> bool:
            text = (await scrape(base)).text
            return samples(text, "tollhouse_usage_outbox_depth") == [({}, 1.0)]

        await until(waiting, what="the usage event in the outbox")
        text = (await scrape(base)).text
    (age,) = samples(text, "tollhouse_usage_outbox_oldest_age_seconds")
    assert age[1] >= 0
    assert samples(text, "tollhouse_metering_hook_duration_seconds_count") == [({}, 1.0)]
