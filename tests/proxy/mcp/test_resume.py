"""An answer on a resumed stream (proxy/mcp/resume.py), settled by how its call stands: each
branch of `Resumption.settle` on the memory store and the memory audit sink, with the real
guardrails policy reading the result. The whole path, two replicas and a kill -9, is
tests/replicas/test_resumed_answer.py."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

import orjson
import pytest

from policies.guardrails import Guardrails
from proxy.audit import MemoryAuditSink
from proxy.chain import Chain
from proxy.config import from_dict
from proxy.mcp.resume import ResumedRelay, Resumption
from proxy.mcp.sse import event_data
from proxy.state.inflight import call_key
from proxy.state.resumable import ANSWERED, MemoryResumable
from proxy.state.sessions import Session
from tests.builders import principal

SECRET = "AKIAIOSFODNN7EXAMPLE"
ALICE = principal()
SESSION = Session("sid", "up", ALICE.key, "upstream-sid")
CONTEXT = {"method": "tools/call", "params": {"name": "config"}, "tool": "config",
           "call_id": "call-1", "note": None, "bytes_in": 42, "era": "legacy",
           "upstream_url": "http://u/mcp", "started_at": 0.0}
CHAIN = Chain([Guardrails(from_dict({"upstreams": [{"name": "up", "url": "http://u/mcp"}],
                                     "guardrails": [{"name": "keys", "tools": ["config"],
                                                     "on": ["results"], "detect": ["secrets"],
                                                     "action": "redact"}]}, env={}))])


def answer(request_id: object = 7) -> tuple[dict[str, object], bytes]:
    obj = {"jsonrpc": "2.0", "id": request_id,
           "result": {"content": [{"type": "text", "text": f"key={SECRET}"}]}}
    return obj, b"id: 9\ndata: " + orjson.dumps(obj) + b"\n\n"


@pytest.fixture
def parts() -> tuple[MemoryResumable, MemoryAuditSink, Resumption]:
    store, audit = MemoryResumable(), MemoryAuditSink()
    return store, audit, Resumption(store, audit)


async def settle(resumption: Resumption, request_id: object = 7) -> dict[str, object]:
    obj, event = answer(request_id)
    out = await resumption.settle(CHAIN, "up", SESSION, ALICE, obj, event)
    return orjson.loads(event_data(out))


async def test_an_open_call_is_recorded_once_and_its_result_rewritten(parts: tuple) -> None:
    store, audit, resumption = parts
    key = call_key("up", ALICE.key, "sid", 7)
    await store.remember(key, CONTEXT, 60)
    for _ in range(2):  # a second resume delivers it again, and records nothing more
        sent = await settle(resumption)
        assert sent["result"]["content"][0]["text"] == "key=[REDACTED:secret]"
    [record] = audit.records
    assert (record.method, record.tool, record.status, record.call_id, record.request_id) == (
        "tools/call", "config", "ok", "call-1", "7")
    assert (record.principal, record.session_hash, record.bytes_in) == (
        "alice", SESSION.id_hash, 42)
    assert record.note == ("guardrail keys: redact secret in result; "
                           "answered on a resumed stream")
    claimed = await store.claim(key)
    assert claimed is not None and claimed.state == ANSWERED


async def test_an_answer_its_own_replica_recorded_goes_out_rewritten_unrecorded(
        parts: tuple) -> None:
    store, audit, resumption = parts
    key = call_key("up", ALICE.key, "sid", 7)
    await store.remember(key, CONTEXT, 60)
    store.settled(key, answered=True)
    assert (await settle(resumption))["result"]["content"][0]["text"] == \
        "key=[REDACTED:secret]"
    assert audit.records == []


async def test_a_call_that_ended_unanswered_keeps_its_answer_out(parts: tuple) -> None:
    store, audit, resumption = parts
    key = call_key("up", ALICE.key, "sid", 7)
    await store.remember(key, CONTEXT, 60)
    store.settled(key, answered=False)  # e.g. recorded cancelled: the client went away
    sent = await settle(resumption)
    assert sent["error"]["code"] == -32800 and "result" not in sent
    assert audit.records == []


@pytest.mark.parametrize("request_id", [7, "7"])
async def test_an_answer_nobody_kept_the_call_of_is_withheld_and_audited_as_failed(
        parts: tuple, request_id: object) -> None:
    store, audit, resumption = parts
    await store.remember(call_key("up", ALICE.key, "sid", 8), CONTEXT, 60)  # another call
    await store.remember(call_key("up", "someone-else", "sid", request_id), CONTEXT, 60)
    sent = await settle(resumption, request_id)
    assert sent["id"] == request_id and sent["error"]["code"] == -32000
    assert SECRET not in orjson.dumps(sent).decode()
    [record] = audit.records
    assert (record.status, record.request_id, record.principal) == (
        "error", "7", "alice")
    assert "resumed stream withheld" in (record.error_message or "")


def log_event(text: str) -> bytes:
    note = {"jsonrpc": "2.0", "method": "notifications/message",
            "params": {"level": "info", "data": text}}
    return b"id: 8\ndata: " + orjson.dumps(note) + b"\n\n"


async def test_held_notifications_go_out_before_the_answer_as_the_call_s_rules_leave_them(
        parts: tuple) -> None:
    store, audit, resumption = parts
    await store.remember(call_key("up", ALICE.key, "sid", 7), CONTEXT, 60)
    obj, event = answer()
    out = await resumption.settle(CHAIN, "up", SESSION, ALICE, obj, event,
                                  [log_event(f"key={SECRET}"), log_event("plain")])
    assert SECRET not in out.decode()
    texts = [orjson.loads(event_data(e + b"\n\n")) for e in out.split(b"\n\n") if e]
    assert [t.get("params", {}).get("data") for t in texts[:2]] == [
        "key=[REDACTED:secret]", "plain"]
    assert texts[2]["id"] == 7
    assert "guardrail keys: redact secret in notifications/message" in audit.records[0].note


async def test_held_notifications_of_a_call_nobody_kept_are_left_out(parts: tuple) -> None:
    _, _, resumption = parts
    obj, event = answer()
    out = await resumption.settle(CHAIN, "up", SESSION, ALICE, obj, event,
                                  [log_event(f"key={SECRET}")])
    assert b"notifications/message" not in out and SECRET not in out.decode()


async def chunks(*parts: bytes) -> AsyncIterator[bytes]:
    for part in parts:
        yield part


@pytest.mark.parametrize("hold", [True, False])
async def test_a_resumed_relay_holds_notices_for_the_answer_only_where_a_rule_reads_them(
        hold: bool) -> None:
    settled: list[tuple[dict[str, object], list[bytes]]] = []

    async def settle(obj: dict[str, object], event: bytes, held: Sequence[bytes]) -> bytes:
        settled.append((obj, list(held)))
        return b"".join(held) + event

    async def close() -> None:
        return None

    notice, (obj, event) = log_event("x"), answer()
    request = b'id: 5\ndata: {"jsonrpc":"2.0","id":"s1","method":"elicitation/create"}\n\n'
    relay = ResumedRelay(chunks(notice, request, event[:10], event[10:]), close,
                         settle=settle, limit=1 << 20, hold_notices=hold)
    out = [piece async for piece in relay]
    assert b"".join(out) == (request + notice + event if hold else notice + request + event)
    assert out[0] == (request if hold else notice)  # a request to the client is never held
    assert settled == [(obj, [notice] if hold else [])]
