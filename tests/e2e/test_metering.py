"""The metering webhook end to end: the signed contract, each denial's wire answer and audit,
a denied call never reaching the upstream, and usage events surviving a receiver outage and a
gateway restart, each settled exactly once."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson

from proxy.audit import query
from tests import db_backends
from tests.e2e.conftest import stack_config
from tests.e2e.test_eras import modern_request
from tests.e2e.upstreams import UpstreamProbe, stateless_json_app
from tests.helpers import DEADLINE_S, until
from tests.servers import serve
from tests.stack import gateway_stack

SECRET = "metering-hmac-secret"


@dataclass
class Receiver:
    """The billing system: answers authorize by tool name, settles usage by call id."""

    deny: dict[str, dict[str, Any]] = field(default_factory=dict)
    usage_up: bool = True
    settled: dict[str, dict[str, Any]] = field(default_factory=dict)
    deliveries: int = 0
    bad_signatures: int = 0
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        headers = dict(scope["headers"])
        expected = "sha256=" + hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
        if headers.get(b"x-tollhouse-signature", b"").decode() != expected:
            self.bad_signatures += 1
            return await self._answer(send, 401, {})
        event = orjson.loads(body)
        if event["type"] == "authorize":
            return await self._answer(send, 200, self.deny.get(event["tool"], {"allow": True}))
        if not self.usage_up:
            return await self._answer(send, 503, {})
        self.deliveries += 1
        self.settled.setdefault(event["call_id"], event)  # idempotent by call id
        self.changed.set()
        await self._answer(send, 204, None)

    async def _answer(self, send: Any, status: int, body: Any) -> None:
        payload = orjson.dumps(body) if body is not None else b""
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": payload})

    async def wait_settled(self, count: int) -> None:
        async def enough() -> None:
            while len(self.settled) < count:
                self.changed.clear()
                await self.changed.wait()

        await asyncio.wait_for(enough(), DEADLINE_S)


@asynccontextmanager
async def gateway(tmp_path: Path, receiver_url: str, upstream_url: str) -> AsyncIterator[str]:
    """A gateway in front of `upstream_url` (`open_stack`'s config), billing to the receiver;
    apart from the upstream, so a second one can restart on the same database."""
    cfg = stack_config(upstream_url, db_backends.url(), {
        "metering": {"url": receiver_url, "secret": SECRET, "timeout_ms": 2000}})
    async with gateway_stack(cfg) as site:
        yield site.endpoint("up")


def legacy_call(tool: str, request_id: int = 1) -> tuple[bytes, dict[str, str]]:
    body = orjson.dumps({"jsonrpc": "2.0", "id": request_id, "method": "tools/call",
                         "params": {"name": tool, "arguments": {"text": "x"}}})
    return body, {"content-type": "application/json",
                  "accept": "application/json, text/event-stream"}


@asynccontextmanager
async def upstream() -> AsyncIterator[tuple[str, UpstreamProbe]]:
    app, probe = stateless_json_app()
    async with serve(app, graceful_timeout=1) as url:
        yield url, probe


async def test_allowed_call_is_billed_once_with_the_contract_fields(tmp_path: Path) -> None:
    receiver = Receiver()
    async with serve(receiver) as r_url, upstream() as (u_url, probe), \
            gateway(tmp_path, r_url, u_url) as endpoint, httpx.AsyncClient() as client:
        response = await client.post(endpoint, content=legacy_call("echo")[0],
                                     headers=legacy_call("echo")[1])
        assert response.json()["result"]["content"][0]["text"] == "x"
        await receiver.wait_settled(1)
    (event,) = receiver.settled.values()
    assert set(event) == {"type", "call_id", "principal", "endpoint", "tool", "status",
                          "duration_ms", "bytes_in", "bytes_out", "error", "at"}
    assert (event["type"], event["endpoint"], event["tool"], event["status"]) == (
        "usage", "up", "echo", "ok")
    assert event["bytes_in"] > 0 and event["bytes_out"] > 0 and event["error"] is None
    assert receiver.bad_signatures == 0 and len(probe.tool_calls("echo")) == 1
    (record,) = [r for r in query(db_backends.url()) if r["tool"] == "echo"]
    assert record["call_id"] == event["call_id"]


async def test_denials_in_both_eras_never_reach_the_upstream(tmp_path: Path) -> None:
    receiver = Receiver(deny={
        "echo": {"allow": False, "reason": "insufficient_credits"},
        "boom": {"allow": False, "reason": "plan_limit", "user_message": "Upgrade your plan."}})
    async with serve(receiver) as r_url, upstream() as (u_url, probe), \
            gateway(tmp_path, r_url, u_url) as endpoint, httpx.AsyncClient() as client:
        for era in ("legacy", "modern"):
            for tool in ("echo", "boom"):
                body, headers = (legacy_call(tool) if era == "legacy" else modern_request(
                    "tools/call", {"name": tool, "arguments": {"text": "x"}}))
                response = await client.post(endpoint, content=body, headers=headers)
                assert response.status_code == 200
                if tool == "echo":
                    assert response.json()["error"] == {"code": -32000,
                                                         "message": "insufficient_credits"}
                else:
                    result = response.json()["result"]
                    assert result["isError"] is True
                    assert result["content"] == [{"type": "text", "text": "Upgrade your plan."}]
                    assert result["structuredContent"]["code"] == "gateway.metering.denied"
                    assert result["structuredContent"]["retryable"] is False
    assert probe.calls == []
    records = [r for r in query(db_backends.url()) if r["method"] == "tools/call"]
    assert sorted((r["era"], r["status"], r["denied_reason"]) for r in records) == [
        ("legacy", "denied", "insufficient_credits"), ("legacy", "denied", "plan_limit"),
        ("modern", "denied", "insufficient_credits"), ("modern", "denied", "plan_limit")]
    assert receiver.settled == {}


async def test_usage_survives_an_outage_and_a_restart_exactly_once(tmp_path: Path) -> None:
    receiver = Receiver(usage_up=False)
    async with serve(receiver) as r_url, upstream() as (u_url, _probe):
        async with gateway(tmp_path, r_url, u_url) as endpoint, httpx.AsyncClient() as client:
            for i in range(3):
                body, headers = legacy_call("echo", i)
                assert (await client.post(endpoint, content=body, headers=headers)
                        ).status_code == 200
        assert receiver.settled == {}  # the receiver was down the whole time
        receiver.usage_up = True
        async with gateway(tmp_path, r_url, u_url):  # a new process on the same database
            await receiver.wait_settled(3)
            # the receiver answered before the worker marks the rows: wait for the marks
            # (a stop in between would leave them for the next start: at least once)
            await until(lambda: db_backends.rows(
                db_backends.url(), "SELECT count(*) FROM usage_outbox "
                "WHERE delivered_at IS NULL") == [(0,)], what="the outbox marked delivered")
    ids = {r["call_id"] for r in query(db_backends.url()) if r["tool"] == "echo"}
    assert set(receiver.settled) == ids and len(ids) == 3
