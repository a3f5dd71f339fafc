"""The request log line: a value a caller or an upstream chose cannot forge a line or a field,
and it is cut to a bounded length; a traceparent gives its trace id only when valid."""

from __future__ import annotations

import logging
from pathlib import Path

import orjson
import pytest

from proxy.audit.record import AuditRecord, MemoryAuditSink
from proxy.observability.logs import MAX_VALUE, JsonFormatter, RequestLog, trace_id
from tests.e2e.conftest import open_stack
from tests.e2e.sdk_client import connect
from tests.e2e.upstreams import stateless_json_app

META_TP = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_a_forged_value_stays_inside_its_field(caplog: pytest.LogCaptureFixture) -> None:
    record = AuditRecord(endpoint="up", method="tools/call\nstatus=ok", tool="t" * 500,
                         request_id='7" status=ok')
    record.error_type = "-1\nhttp_status=200"
    with caplog.at_level(logging.INFO, logger="tollhouse.request"):
        RequestLog().end(record)
    (line,) = [r.getMessage() for r in caplog.records]
    assert "\n" not in line
    assert 'method="tools/call\\nstatus=ok"' in line
    assert 'request_id="7\\" status=ok"' in line
    assert 'error_type="-1\\nhttp_status=200"' in line
    assert f"tool={'t' * MAX_VALUE} " in line and "t" * (MAX_VALUE + 1) not in line


def test_the_json_line(caplog: pytest.LogCaptureFixture) -> None:
    record = AuditRecord(endpoint="up", method="ping", request_id="1")
    record.http_status, record.duration_ms = 200, 1.23456
    with caplog.at_level(logging.INFO, logger="tollhouse.request"):
        RequestLog("json").end(record)
    line = orjson.loads(JsonFormatter().format(caplog.records[0]))
    assert {k: line[k] for k in ("endpoint", "method", "request_id", "status", "http_status",
                                 "duration_ms", "trace_id", "error_type")} == {
        "endpoint": "up", "method": "ping", "request_id": "1", "status": "ok",
        "http_status": 200, "duration_ms": 1.235, "trace_id": "", "error_type": ""}


def test_nothing_is_built_when_info_is_off(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="tollhouse.request"):
        RequestLog().end(AuditRecord(endpoint="up"))
    assert caplog.records == []


@pytest.mark.parametrize(("value", "expected"), [
    ("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
     "4bf92f3577b34da6a3ce929d0e0e4736"),
    ("00-00000000000000000000000000000000-00f067aa0ba902b7-01", ""),  # the invalid all-zero id
    ("00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01", ""),  # upper case: invalid
    ("garbage", ""), (None, ""), (12, ""),
])
def test_trace_id(value: object, expected: str) -> None:
    assert trace_id(value) == expected


def test_httpx_does_not_log_every_request_at_info() -> None:
    """The metering webhook gets a POST per usage event: httpx's INFO line for each would be
    a second, unasked log line per call (and its cost)."""
    from proxy.observability import logs

    chatty = logging.getLogger("httpx")
    before = chatty.level
    try:
        logs.configure("info")
        assert not chatty.isEnabledFor(logging.INFO)
        assert chatty.isEnabledFor(logging.WARNING)
    finally:
        chatty.setLevel(before)


async def test_the_message_s_own_traceparent_names_the_trace_with_tracing_off(
        tmp_path: Path) -> None:
    """The spine reads a `_meta.traceparent` onto the record, so the log line names it
    whichever observers are on (here: no tracer), where the request log observer used to
    write it."""
    audit = MemoryAuditSink()
    async with open_stack(tmp_path, stateless_json_app, audit=audit) as stack, \
            connect(stack.endpoint) as client:
        await client.call_tool("echo", {"text": "x"}, meta={"traceparent": META_TP})
    (call,) = [r for r in audit.records if r.method == "tools/call"]
    assert call.trace_id == "4bf92f3577b34da6a3ce929d0e0e4736"
