"""Issue 44: an answer that reaches the client on a resumed stream, after the replica that ran
its call was killed (kill -9), is recorded, billed and held to the call's result rules before
it goes out, as it would have been on the call's own stream.

The upstream keeps its SSE events (an event store), so the official SDK client, whose POST
stream broke with the replica, resumes it with a GET carrying `Last-Event-ID`; HAProxy sends
that GET to the surviving replica, and the upstream replays the call's answer on it. Before the
fix the survivor relayed that answer as it came: the client held an answer that had no audit
record and no usage event, and whose secret no guardrail had redacted."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from mcp import types
from mcp.server.mcpserver import Context, MCPServer

from proxy.audit import query
from tests.conformance.server import MemoryEventStore
from tests.db_backends import rows
from tests.e2e.sdk_client import connect
from tests.helpers import DEADLINE_S
from tests.replicas.harness import open_cluster
from tests.servers import serve

SECRET = "AKIAIOSFODNN7EXAMPLE"


class Meter:
    """The metering hook (`metering.hook` names METER, in each replica's process): every
    call allowed, so each gets a call id and a usage event in the outbox."""

    async def authorize(self, request: dict[str, Any]) -> dict[str, Any]:
        return {"allow": True}

    async def record(self, event: dict[str, Any]) -> None:
        return None


METER = Meter()


@dataclass
class Held:
    """An upstream whose `hold` tool reports progress, then answers (with a secret in it)
    only once the test sets `release`."""

    url: str
    started: asyncio.Event
    release: asyncio.Event


@pytest.fixture
async def held() -> AsyncIterator[Held]:
    started, release = asyncio.Event(), asyncio.Event()
    server = MCPServer("resumable", version="1.0.0")

    @server.tool()
    async def hold(text: str, ctx: Context) -> str:
        """Report progress, wait for the test, then answer."""
        await ctx.report_progress(1, 2)
        started.set()
        await release.wait()
        note = types.LoggingMessageNotification(params=types.LoggingMessageNotificationParams(
            level="info", data=f"log key={SECRET}"))
        await ctx.session.send_notification(note, related_request_id=ctx.request_id)
        return f"{text} key={SECRET}"

    app = server.streamable_http_app(streamable_http_path="/mcp",
                                     event_store=MemoryEventStore(), retry_interval=100)
    async with serve(app, graceful_timeout=1) as url:
        yield Held(url, started, release)


async def test_an_answer_resumed_through_another_replica_is_recorded_billed_and_redacted(
        tmp_path: Path, held: Held) -> None:
    config = {"metering": {"hook": f"{__name__}:METER", "timeout_ms": 2000},
              "guardrails": [{"name": "keys", "tools": ["hold"], "on": ["results"],
                              "detect": ["secrets"], "action": "redact"}]}
    logged: list[Any] = []

    async def on_log(params: types.LoggingMessageNotificationParams) -> None:
        logged.append(params.data)

    async with open_cluster(tmp_path, held.url, era="legacy", config=config) as cluster, \
            connect(cluster.endpoint, logging_callback=on_log) as client:
        progressed = asyncio.Event()

        async def on_progress(value: float, total: float | None, message: str | None) -> None:
            progressed.set()  # the client holds an event id of the call's stream

        call = asyncio.create_task(client.call_tool("hold", {"text": "resumed"},
                                                    progress_callback=on_progress))
        await asyncio.wait_for(progressed.wait(), DEADLINE_S)
        ran = await cluster.logged(lambda s: s.rpc_method == "tools/call", "the hold call")
        dead = cluster.replica(ran.server)
        dead.kill()
        assert await asyncio.wait_for(dead.process.wait(), DEADLINE_S) == -9
        held.release.set()

        # (the dead replica answers nothing: whatever the client gets came through the other)
        result = await asyncio.wait_for(call, DEADLINE_S)
        assert result.content[0].text == "resumed key=[REDACTED:secret]"
        # the log line the call sent before its answer, replayed with it: the call's rules
        # read it as they would have on the call's own stream
        assert logged == ["log key=[REDACTED:secret]"]

    records = [r for r in query(cluster.database_url, limit=100) if r["method"] == "tools/call"]
    assert len(records) == 1, records
    record = records[0]
    assert (record["tool"], record["status"]) == ("hold", "ok")
    assert record["request_id"] == str(ran.rpc["id"])
    assert "answered on a resumed stream" in (record["note"] or "")
    assert "guardrail keys: redact secret in result" in (record["note"] or "")
    assert "guardrail keys: redact secret in notifications/message" in (record["note"] or "")
    assert record["call_id"]
    assert rows(cluster.database_url, "SELECT count(*) FROM usage_outbox WHERE call_id = ?",
                record["call_id"]) == [(1,)]

