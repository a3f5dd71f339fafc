"""Streaming the audit log (#39 item 2): a gateway on Hypercorn, a real MCP upstream, real
calls, and each export kind against a real receiver started here; every record the audit table
holds must reach the receiver, compared one by one (the event id is the SHA-256 of the row as
stored, the payload the OCSF mapping or the native record of that row), in the order the
writer committed them. A receiver down for a while gets everything once back; a full backlog
is counted, never silent. On SQLite and PostgreSQL (TOLLHOUSE_TEST_DATABASE)."""

from __future__ import annotations

import contextlib
import datetime
import logging
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from proxy.audit.commit import COLUMNS
from proxy.audit.exports import ocsf, status
from proxy.audit.exports.queue import event_id, native
from proxy.config import ConfigError, from_dict
from tests import db_backends
from tests.e2e.upstreams import stateless_json_app
from tests.helpers import until
from tests.proxy.audit.exports.receivers import (
    HEC_TOKEN,
    WEBHOOK_SECRET,
    HecReceiver,
    OtlpReceiver,
    Received,
    SyslogReceiver,
    WebhookReceiver,
    tls_pair,
)
from tests.servers import serve
from tests.stack import Site, Urls, gateway_stack

DEADLINE_S = 30.0
HEADERS = {"content-type": "application/json", "accept": "application/json, text/event-stream"}


def audit_rows() -> list[tuple[Any, ...]]:
    """The audit table, in the order its one writer committed it."""
    return db_backends.rows(db_backends.url(), f"SELECT {', '.join(COLUMNS)} FROM audit "
                                               "ORDER BY id")


def expected(fmt: str) -> list[tuple[str, dict[str, Any]]]:
    """What an export of `fmt` must have received: each audit row's event id and payload."""
    out = []
    for row in audit_rows():
        eid = event_id(row)
        record = native(COLUMNS, row, eid)
        out.append((eid, ocsf.event(record) if fmt == "ocsf" else record))
    return out


def without_nulls(value: Any) -> Any:
    """A payload as OTLP carries it: OTLP's AnyValue has no null."""
    if isinstance(value, dict):
        return {k: without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [without_nulls(v) for v in value if v is not None]
    return value


def first_of_each(events: list[tuple[str, dict[str, Any]]]) -> list[tuple[str, dict[str, Any]]]:
    """The events in the order received, each event id once; a repeat must be identical."""
    seen: dict[str, dict[str, Any]] = {}
    out = []
    for eid, payload in events:
        if eid in seen:
            assert seen[eid] == payload, f"event {eid} sent twice with different payloads"
            continue
        seen[eid] = payload
        out.append((eid, payload))
    return out


async def calls(site: Site, n: int, tag: str) -> int:
    """`n` tools/call of echo (ok), one of a tool the access rules refuse (denied), and one
    tools/list."""
    async with httpx.AsyncClient(timeout=10) as http:
        for i in range(n):
            body = {"jsonrpc": "2.0", "id": f"{tag}-{i}", "method": "tools/call",
                    "params": {"name": "echo", "arguments": {"text": f"{tag}-{i}"}}}
            response = await http.post(site.endpoint("up"), json=body, headers=HEADERS)
            assert response.status_code == 200, response.text
        for body in ({"jsonrpc": "2.0", "id": f"{tag}-x", "method": "tools/call",
                      "params": {"name": "hidden_tool", "arguments": {}}},
                     {"jsonrpc": "2.0", "id": f"{tag}-l", "method": "tools/list"}):
            await http.post(site.endpoint("up"), json=body, headers=HEADERS)
    return n + 2  # the audit records these made


def config(export: dict[str, Any]) -> Callable[[Any], dict[str, Any]]:
    return lambda urls: {
        "upstreams": [{"name": "up", "url": f"{urls.upstream}/mcp",
                       "access": {"tools_deny": ["hidden_*"]}}],
        "audit": {"exports": [{"name": "siem", "retry_max_s": 1.0, "timeout_s": 5.0,
                               **export}]},
    }


@contextlib.asynccontextmanager
async def receiving(kind: str, tmp_path: Path) -> AsyncIterator[tuple[Received, dict[str, Any]]]:
    """The receiver of `kind`, running, and the export keys that reach it."""
    if kind in ("syslog", "syslog-tls"):
        tls, ca_file = tls_pair(tmp_path) if kind == "syslog-tls" else (None, None)
        listener = SyslogReceiver(tls)
        await listener.start()
        scheme = "tls" if tls else "tcp"
        try:
            yield listener, {"kind": "syslog", "url": f"{scheme}://127.0.0.1:{listener.port}",
                             **({"ca_file": str(ca_file)} if ca_file else {})}
        finally:
            await listener.stop()
        return
    receiver: Received
    if kind == "otlp":
        receiver = OtlpReceiver()
        async with serve(receiver) as url:
            yield receiver, {"kind": "otlp", "url": f"{url}/v1/logs"}
    elif kind == "splunk_hec":
        receiver = HecReceiver()
        async with serve(receiver) as url:
            yield receiver, {"kind": "splunk_hec", "url": url, "token": HEC_TOKEN}
    else:
        receiver = WebhookReceiver()
        async with serve(receiver) as url:
            yield receiver, {"kind": "webhook", "url": f"{url}/hook", "secret": WEBHOOK_SECRET}


async def delivered(receiver: Received, fmt: str, made: int
                    ) -> list[tuple[str, dict[str, Any]]]:
    """Wait until the audit table holds the `made` records and the receiver every one of
    them; what it should hold."""
    want: list[tuple[str, dict[str, Any]]] = []

    def complete() -> bool:
        want[:] = expected(fmt)
        return len(want) >= made and {eid for eid, _ in want} <= set(receiver.ids())

    try:
        await until(complete, DEADLINE_S, "every audit record at the receiver")
    except AssertionError:
        missing = {eid for eid, _ in want} - set(receiver.ids())
        raise AssertionError(f"{len(missing)} of {len(want)} records never arrived; "
                             f"bad: {receiver.bad}") from None
    return want


KINDS = [("syslog", "ocsf"), ("syslog-tls", "native"), ("otlp", "ocsf"), ("otlp", "native"),
         ("splunk_hec", "native"), ("splunk_hec", "ocsf"), ("webhook", "ocsf")]


@pytest.mark.parametrize(("kind", "fmt"), KINDS)
async def test_every_record_reaches_the_receiver_in_order(kind: str, fmt: str,
                                                          tmp_path: Path) -> None:
    app, _ = stateless_json_app()
    async with receiving(kind, tmp_path) as (receiver, keys), \
            gateway_stack(config({**keys, "format": fmt}), upstream=app) as site:
        made = await calls(site, 12, "a")
        want = await delivered(receiver, fmt, made)
        got = first_of_each(receiver.events)
        assert not receiver.bad
        assert {eid for eid, _ in got} == {eid for eid, _ in want}  # none from elsewhere
        if kind == "otlp":
            want = [(eid, without_nulls(payload)) for eid, payload in want]
        for (eid, payload), (want_id, want_payload) in zip(got, want, strict=True):
            assert eid == want_id  # in the order the writer committed them
            assert payload == want_payload, eid
        statuses = {r["status"] for _, r in (expected("native"))}
        assert statuses == {"ok", "denied"} and len(want) == made
        if isinstance(receiver, SyslogReceiver):
            for header, (_, record) in zip(receiver.headers, expected("native"), strict=False):
                severity = {"denied": 4, "error": 3}.get(record["status"], 6)
                assert header["pri"] == 13 * 8 + severity
                assert (header["app"], header["msgid"], header["sd"]) == ("tollhouse", "audit",
                                                                          "-")
                stamp = datetime.datetime.fromisoformat(header["timestamp"])
                assert abs(stamp.timestamp() - record["ts"]) < 1e-5
        await until(lambda: _backlog_empty(site), DEADLINE_S, "the backlog emptied")
        rows = await _status(site)
        assert rows[0]["sent"] >= len(want) and rows[0]["last_error"] is None


async def _status(site: Site) -> list[Any]:
    import asyncio

    database = site.services.database
    return await asyncio.to_thread(status, database, site.services.cfg.audit.exports)


def test_ocsf_fields_of_a_denied_call() -> None:
    """The mapping's fixed fields, on a record of each kind the docs name."""
    record = {"ts": 1767225600.123456, "request_id": "7", "principal": "alice",
              "endpoint": "github", "method": "tools/call", "tool": "delete_repo",
              "status": "denied", "denied_reason": "tool not allowed", "error_message": None,
              "duration_ms": 1.5, "bytes_in": 120, "bytes_out": 0, "era": "legacy",
              "session_hash": "abc", "client_name": "claude", "call_id": None, "note": None,
              "egress": None, "upstream": None, "policy": '{"decision": "deny"}',
              "event_id": "e-1"}
    event = ocsf.event(record)
    assert (event["class_uid"], event["category_uid"], event["activity_id"],
            event["type_uid"]) == (6003, 6, 99, 600399)
    assert (event["status_id"], event["severity_id"], event["status_detail"]) == (
        2, 3, "tool not allowed")
    assert event["time"] == 1767225600123 and event["duration"] == 2
    assert event["metadata"]["uid"] == "e-1" and event["metadata"]["version"].startswith("1.")
    assert event["actor"] == {"user": {"uid": "alice", "name": "alice"},
                              "session": {"uid": "abc"}, "app_name": "claude"}
    assert event["api"]["operation"] == "tools/call"
    assert event["api"]["service"] == {"name": "github"}
    assert event["resources"] == [{"type": "tool", "name": "delete_repo"}]
    assert event["unmapped"]["policy"] == {"decision": "deny"}
    assert ocsf.activity("tools/list") == 2 and ocsf.activity("initialize") == 1
    assert ocsf.activity("DELETE") == 4


async def test_a_receiver_down_for_a_while_gets_everything_once_back(tmp_path: Path,
                                                                     caplog: Any) -> None:
    app, _ = stateless_json_app()
    async with receiving("webhook", tmp_path) as (receiver, keys), \
            gateway_stack(config({**keys, "format": "native"}), upstream=app) as site:
        made = await calls(site, 3, "before")
        await delivered(receiver, "native", made)
        receiver.up = False
        caplog.set_level(logging.WARNING, "tollhouse.audit.export")
        made += await calls(site, 5, "during")

        async def failing() -> bool:
            rows = await _status(site)
            return receiver.refused >= 2 and rows[0]["failed"] > 0 and rows[0]["backlog"] > 0

        await until(failing, DEADLINE_S, "the export failing while the receiver is down")
        rows = await _status(site)
        assert rows[0]["last_error"] == "SendFailed: the receiver answered HTTP 503"
        assert rows[0]["lag_s"] > 0
        assert WEBHOOK_SECRET not in caplog.text and "not delivered" in caplog.text
        receiver.up = True
        made += await calls(site, 2, "after")
        want = await delivered(receiver, "native", made)
        got = first_of_each(receiver.events)
        assert [eid for eid, _ in got] == [eid for eid, _ in want]
        assert [p for _, p in got] == [p for _, p in want]
        await until(lambda: _backlog_empty(site), DEADLINE_S, "the backlog emptied")


async def _backlog_empty(site: Site) -> bool:
    return (await _status(site))[0]["backlog"] == 0


async def test_a_syslog_listener_that_goes_away_and_returns(tmp_path: Path) -> None:
    app, _ = stateless_json_app()
    async with receiving("syslog", tmp_path) as (receiver, keys), \
            gateway_stack(config({**keys, "format": "native"}), upstream=app) as site:
        assert isinstance(receiver, SyslogReceiver)
        made = await calls(site, 3, "before")
        await delivered(receiver, "native", made)
        await receiver.stop()  # refused from now on; the open connection closed
        made += await calls(site, 4, "during")

        async def failing() -> bool:
            return (await _status(site))[0]["failed"] > 0

        await until(failing, DEADLINE_S, "a send to the stopped listener failing")
        await receiver.start()  # the same port
        want = await delivered(receiver, "native", made)
        assert [eid for eid, _ in first_of_each(receiver.events)] == [e for e, _ in want]


async def test_a_full_backlog_drops_new_records_counted_and_logged(tmp_path: Path,
                                                                   caplog: Any) -> None:
    app, _ = stateless_json_app()
    caplog.set_level(logging.ERROR, "tollhouse.audit.export")
    async with receiving("webhook", tmp_path) as (receiver, keys), \
            gateway_stack(config({**keys, "max_backlog": 3}), upstream=app) as site:
        receiver.up = False
        await calls(site, 4, "fill")  # 6 records: the backlog reaches 3, is seen full

        async def full() -> bool:
            return (await _status(site))[0]["full"]

        await until(full, DEADLINE_S, "the backlog full")

        async def dropped() -> bool:  # calls go on until the writer has seen it full
            await calls(site, 0, "over")
            return (await _status(site))[0]["dropped"] > 0

        await until(dropped, DEADLINE_S, "records counted as dropped")
        assert "backlog is full" in caplog.text
        metrics = site.services.metrics
        assert metrics is not None
        assert metrics.export_dropped.labels("siem")._value.get() > 0
        receiver.up = True

        async def drained() -> bool:
            row = (await _status(site))[0]
            return row["backlog"] == 0 and not row["full"]

        await until(drained, DEADLINE_S, "the backlog drained")
        row = (await _status(site))[0]
        ids = set(receiver.ids())
        every = {eid for eid, _ in expected("ocsf")}
        # what was queued arrived; what was dropped is counted; together every record
        assert ids <= every and len(every - ids) == row["dropped"]


@pytest.mark.parametrize(("change", "message"), [
    ({"kind": "kafka"}, ("'audit.exports[0].kind' must be one of syslog, otlp, splunk_hec, "
                        "webhook")),
    ({"format": "cef"}, "'audit.exports[0].format' must be one of ocsf, native"),
    ({"url": "udp://127.0.0.1:514"}, ("'audit.exports[0].url' must be tcp://host:port or "
                                     "tls://host:port")),
    ({"kind": "splunk_hec", "url": "https://splunk:8088"}, ("'audit.exports[0].token' is "
                                                           "required with kind = splunk_hec")),
    ({"token": "s3cret-token-value"}, "'audit.exports[0].token' is for kind = splunk_hec"),
    ({"kind": "webhook", "url": "https://h/x", "secret": "short"},
     "'audit.exports[0].secret' is required with kind = webhook"),
    ({"kind": "webhook", "url": "tcp://h:1", "secret": "x" * 20},
     "'audit.exports[0].url' must be an http:// or https:// URL"),
])
def test_a_bad_export_is_refused_naming_the_key(change: dict[str, Any], message: str) -> None:
    export = {"name": "siem", "kind": "syslog", "url": "tcp://127.0.0.1:6514", **change}
    with pytest.raises(ConfigError) as refused:
        from_dict({"audit": {"exports": [export]}}, env={})
    assert message in str(refused.value)
    for secret in ("s3cret-token-value", "short"):
        assert secret not in str(refused.value)


def test_status_of_a_fresh_database_is_empty() -> None:
    cfg = from_dict({"audit": {"exports": [{"name": "siem", "kind": "syslog",
                                            "url": "tcp://127.0.0.1:6514"}]}}, env={})
    database = db_backends.open_database()
    assert status(database, cfg.audit.exports) == [{
        "name": "siem", "kind": "syslog", "format": "ocsf", "backlog": 0, "lag_s": 0.0,
        "sent": 0, "failed": 0, "dropped": 0, "full": False, "last_error": None,
        "last_error_at": None, "last_sent_at": None}]
    assert orjson.dumps(status(database, []))  == b"[]"


async def test_two_gateways_on_one_database_send_once_each_writer_in_order(
        tmp_path: Path) -> None:
    """Both gateways queue for the export; the one holding its lease sends everything, once
    (two senders at a time would repeat records), each gateway's records in the order it wrote
    them; when one stops, the other sends what follows."""
    app, _ = stateless_json_app()
    async with receiving("webhook", tmp_path) as (receiver, keys), serve(app) as upstream_url:
        cfg = config({**keys, "format": "native"})(Urls("", upstream_url))
        async with gateway_stack(cfg) as one:
            async with gateway_stack(cfg) as two:
                made = 0
                for round_ in range(3):
                    made += await calls(one, 3, f"one{round_}")
                    made += await calls(two, 3, f"two{round_}")
                await delivered(receiver, "native", made)
            made += await calls(one, 2, "after")  # `two` stopped, its lease handed back
            want = await delivered(receiver, "native", made)
    assert len(receiver.events) == len(set(receiver.ids())) == len(want)  # each sent once
    position = {eid: i for i, eid in enumerate(receiver.ids())}
    for tag in ("one", "two", "after"):
        mine = [eid for eid, record in want if str(record["request_id"]).startswith(tag)]
        assert mine and [position[e] for e in mine] == sorted(position[e] for e in mine), tag
