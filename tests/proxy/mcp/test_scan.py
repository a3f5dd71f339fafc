"""The streamed answer's scan (`AnswerScan`), an SSE event passed on as it arrives
(`LargeEvent`), and the relay that uses both: whatever the chunking, the same facts as a whole
message gives, and the bytes unchanged."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest

from proxy.audit import AuditRecord, MemoryAuditSink
from proxy.errors import StoreUnavailable, UpstreamStreamCut, render
from proxy.mcp.exchange import Exchange
from proxy.mcp.relay import Carried, JsonRelay, StreamRelay, Views
from proxy.mcp.scan import CAPTURE_BYTES, AnswerScan
from proxy.mcp.sse import HEAD_BYTES, LargeEvent
from proxy.observability import Observers
from tests.helpers import DEADLINE_S

MESSAGES: list[dict[str, Any]] = [
    {"jsonrpc": "2.0", "id": 1, "result": {"content": [{"type": "text", "text": 'a"b\\,}{'}],
                                          "isError": True}},
    {"result": {"isError": False, "x": {"isError": True}}, "id": "x,}", "jsonrpc": "2.0"},
    {"jsonrpc": "2.0", "id": 7, "error": {"code": -32001, "message": 'no \\ " ,}'}},
    {"jsonrpc": "2.0", "method": "x", "id": 3, "params": {"isError": True}},
    {"jsonrpc": "2.0", "id": 2, "result": [{"isError": True}]},
    {"jsonrpc": "2.0", "id": None, "result": {"nested": [[{"id": 9}]], "isError": False}},
]


def expected(msg: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {k: True for k in ("jsonrpc", "method") if k in msg}
    if "id" in msg:
        out["id"] = msg["id"]
    if "error" in msg:
        out["error"] = {"code": msg["error"]["code"]}
    if "result" in msg:
        result = msg["result"]
        out["result"] = {"isError": result["isError"]} \
            if isinstance(result, dict) and "isError" in result else {}
    return out


def pieces(data: bytes, rng: random.Random) -> list[bytes]:
    cuts = sorted(rng.sample(range(1, len(data)), min(len(data) - 1, rng.randint(0, 12))))
    return [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]


@pytest.mark.parametrize("msg", MESSAGES)
@pytest.mark.parametrize("indent", [False, True])
def test_the_scan_learns_what_the_whole_message_says(msg: dict[str, Any], indent: bool) -> None:
    data = orjson.dumps(msg, option=orjson.OPT_INDENT_2 if indent else 0)
    rng = random.Random(len(data))
    for _ in range(100):
        scan = AnswerScan()
        for piece in pieces(data, rng):
            scan.feed(piece)
        assert scan.message() == expected(msg)


@pytest.mark.parametrize("data", [b"[1]", b"x{}", b'{"a":1} x', b'{"a":1', b'"s"', b"}"])
def test_what_is_not_one_json_object_is_no_message(data: bytes) -> None:
    scan = AnswerScan()
    scan.feed(data)
    assert scan.message() is None


def test_a_value_too_large_to_keep_is_not_kept() -> None:
    scan = AnswerScan()
    scan.feed(orjson.dumps({"jsonrpc": "2.0", "error": {"data": "x", "code": -1}, "id": {
        "not": "x" * (2 * CAPTURE_BYTES)}}))
    assert scan.message() == {"jsonrpc": True, "id": {}, "error": {"code": -1}}


def test_the_method_is_known_as_soon_as_its_value_has_passed() -> None:
    data = orjson.dumps({"jsonrpc": "2.0", "method": "notifications/x", "params": {
        "method": "inner", "data": "y" * 1000}})
    scan = AnswerScan()
    scan.feed(data[:data.index(b"params")])
    assert scan.method() == "notifications/x" and not scan.done
    scan.feed(data[data.index(b"params"):])
    assert scan.method() == "notifications/x" and scan.message() == {
        "jsonrpc": True, "method": True}
    answer = AnswerScan()
    answer.feed(big_answer(1, 10))
    assert answer.method() is None


def sse_pieces(event: bytes, rng: random.Random) -> list[bytes]:
    return pieces(event, rng)


@pytest.mark.parametrize("nl", [b"\n", b"\r\n", b"\r"])
def test_a_large_event_ends_where_a_client_ends_it(nl: bytes) -> None:
    body = orjson.dumps(MESSAGES[0])
    cut = body.index(b",") + 1  # a data line may end where JSON allows a line end
    event = b"event: message" + nl + b"data: " + body[:cut] + nl + b"data:" + body[cut:] \
        + nl + nl
    rng = random.Random(7)
    for _ in range(100):
        large = LargeEvent(AnswerScan())
        ends = []
        sent = 0
        for piece in [*sse_pieces(event, rng), b"data: next" + nl]:
            end = large.feed(piece)
            if end is not None:
                ends.append(sent + end)
                break
            sent += len(piece)
        # a CR ending the blank line ends the event at once, as for a client: the LF after it
        # (the rest of a CRLF) is the next event's
        assert ends in ([len(event)], [len(event) - 1] if nl == b"\r\n" else None)
        assert large.scan is not None and large.scan.message() == expected(MESSAGES[0])


async def chunks_of(parts: list[bytes], fail: bool = False) -> AsyncIterator[bytes]:
    for part in parts:
        yield part
    if fail:
        raise UpstreamStreamCut("upstream connection broke")


async def closed() -> None:
    return None


def exchange_of(record: AuditRecord) -> Exchange:
    """The call's exchange a relay writes its record through."""
    return Exchange(record, MemoryAuditSink(), Observers())


async def drain(relay: StreamRelay) -> bytes:
    return b"".join([chunk async for chunk in relay])


def big_answer(rid: Any, size: int, *, is_error: bool = False) -> bytes:
    return orjson.dumps({"jsonrpc": "2.0", "id": rid, "result": {
        "content": [{"type": "text", "text": "y" * size}], "isError": is_error}})


def split(data: bytes, size: int = 16 * 1024) -> list[bytes]:
    return [data[i:i + size] for i in range(0, len(data), size)]


async def test_an_sse_answer_larger_than_the_head_passes_unchanged_and_is_read() -> None:
    event = b"event: message\r\ndata: " + big_answer(5, 4 * HEAD_BYTES, is_error=True) \
        + b"\r\n\r\n"
    note = b"event: message\ndata: " + orjson.dumps({"jsonrpc": "2.0", "method": "n"}) + b"\n\n"
    record = AuditRecord(endpoint="e")
    seen: list[dict[str, Any]] = []
    relay = StreamRelay(chunks_of(split(note + event)), closed,
                        call=Carried(5, exchange=exchange_of(record)),
                        views=Views(rewrite=lambda result: seen.append(result) or False))
    assert await drain(relay) == note + event
    assert relay.answered and record.status == "ok" and seen == [{"isError": True}]
    assert record.bytes_out == len(note + event)


async def test_a_held_sse_answer_over_its_limit_is_refused() -> None:
    event = b"data: " + big_answer(5, 2 * HEAD_BYTES) + b"\n\n"
    record = AuditRecord(endpoint="e")
    relay = StreamRelay(chunks_of(split(event)), closed,
                        call=Carried(5, exchange=exchange_of(record)),
                        views=Views(hold_limit=HEAD_BYTES))
    out = await drain(relay)
    error = orjson.loads(out.rpartition(b"data: ")[2])
    assert error["id"] == 5 and error["error"]["code"] == -32000
    assert f"server.max_response_bytes ({HEAD_BYTES} bytes)" in error["error"]["message"]
    assert record.status == "error" and "max_response_bytes" in (record.error_message or "")


async def test_an_sse_stream_cut_inside_a_large_event_ends_it_then_says_so() -> None:
    event = b"data: " + big_answer(5, 2 * HEAD_BYTES) + b"\n\n"
    record = AuditRecord(endpoint="e")
    relay = StreamRelay(chunks_of(split(event[:-1000]), fail=True), closed,
                        call=Carried(5, exchange=exchange_of(record)))
    out = await drain(relay)
    assert out.startswith(event[:-1000] + b"\n\n")
    error = orjson.loads(out[len(event) - 1000 + 2:].partition(b"data: ")[2])
    assert error["id"] == 5 and error["error"]["code"] == -32000
    assert record.status == "error"


async def test_a_cut_large_event_whose_record_is_kept_nowhere_ends_it_before_the_503() -> None:
    event = b"data: " + big_answer(5, 2 * HEAD_BYTES) + b"\n\n"

    async def kept_nowhere(relay: StreamRelay) -> bool:
        return False

    relay = StreamRelay(chunks_of(split(event[:-1000]), fail=True), closed,
                        call=Carried(5, exchange=exchange_of(AuditRecord(endpoint="e")),
                                     answered=kept_nowhere))
    out = await drain(relay)
    assert out.startswith(event[:-1000] + b"\n\n")  # the started event ended, unfinished
    error = orjson.loads(out[len(event) - 1000 + 2:].partition(b"data: ")[2])
    withheld = orjson.loads(render(StoreUnavailable("the audit log"), 5)[2])
    assert error == withheld  # the 503's error in place of the stream's own


async def test_a_json_answer_passes_unchanged_its_last_chunk_once_it_is_recorded() -> None:
    data = orjson.dumps({"jsonrpc": "2.0", "id": "r", "error": {"code": -32050, "message": "x",
                                                              "data": "z" * HEAD_BYTES}})
    parts = split(data)
    record = AuditRecord(endpoint="e")
    recorded_before_last: list[bool] = []

    async def answered(relay: StreamRelay) -> bool:
        recorded_before_last.append(record.bytes_out == len(data))
        return True

    relay = JsonRelay(parts[0], chunks_of(parts[1:]), closed,
                      call=Carried("r", exchange=exchange_of(record), answered=answered))
    assert await drain(relay) == data
    assert recorded_before_last == [True]
    assert record.status == "error" and record.error_message == "upstream error -32050"


@pytest.mark.parametrize(("parts", "fail"), [
    ([b'{"jsonrpc":"2.0","id":"other","result":{}}'], False),  # not this call's answer
    ([b'{"jsonrpc":"2.0","id":"r","result":{"content":[', b"x" * 100], True),  # cut
])
async def test_a_json_answer_that_cannot_be_finished_ends_short(parts: list[bytes],
                                                                 fail: bool) -> None:
    record = AuditRecord(endpoint="e")
    answered: list[bool] = []

    async def on_answer(relay: StreamRelay) -> bool:
        answered.append(True)
        return True

    relay = JsonRelay(parts[0], chunks_of(parts[1:], fail=fail), closed,
                      call=Carried("r", exchange=exchange_of(record), answered=on_answer))
    out = await drain(relay)
    assert len(out) < sum(map(len, parts)) or not out  # the last chunk is never sent
    assert record.status == "error" and not answered


async def test_a_json_answer_kept_nowhere_is_withheld() -> None:
    data = big_answer(1, HEAD_BYTES)
    parts = split(data)

    async def kept_nowhere(relay: StreamRelay) -> bool:
        return False

    relay = JsonRelay(parts[0], chunks_of(parts[1:]), closed,
                      call=Carried(1, exchange=exchange_of(AuditRecord(endpoint="e")), answered=kept_nowhere))
    out = await drain(relay)
    assert data.startswith(out) and len(out) < len(data)


# -- notifications on a call's stream (guardrails, docs/guardrails.md) ------------------------

SECRET = "AKIAIOSFODNN7EXAMPLE"


def sse(obj: dict[str, Any], nl: bytes = b"\n", head: bytes = b"event: message") -> bytes:
    return head + nl + b"data: " + orjson.dumps(obj) + nl + nl


def log_event(text: str, nl: bytes = b"\n") -> bytes:
    return sse({"jsonrpc": "2.0", "method": "notifications/message",
                "params": {"level": "info", "data": {"said": text}}}, nl)


def progress_event(text: str, nl: bytes = b"\n") -> bytes:
    return sse({"jsonrpc": "2.0", "method": "notifications/progress",
                "params": {"progressToken": "p", "progress": 1, "message": text}}, nl)


def answer_event(rid: Any, text: str) -> bytes:
    return sse({"jsonrpc": "2.0", "id": rid,
                "result": {"content": [{"type": "text", "text": text}]}})


def guarded(action: str) -> tuple[Any, Any, Any]:
    """A guardrails policy with one results rule, and what it gives a tools/call of `t`."""
    from tests.policies.test_guardrails import ctx, msg, policy

    p = policy(screening="off", guardrails=[{"name": "g", "action": action, "on": ["results"]}])
    c = ctx()
    call = msg("tools/call", name="t", arguments={})
    return p.rewriter(call, c), p.noticer(call, c), c


@pytest.mark.parametrize("nl", [b"\n", b"\r\n", b"\r"])
async def test_an_unmatched_call_s_stream_is_relayed_byte_for_byte(nl: bytes) -> None:
    from tests.policies.test_guardrails import ctx, msg, policy

    p = policy(screening="off", guardrails=[{"name": "g", "tools": ["other"]}])
    call = msg("tools/call", name="t", arguments={})
    rewrite, notice = p.rewriter(call, ctx()), p.noticer(call, ctx())
    assert rewrite is None and notice is None  # nothing reads this call's events
    body = (b": comment" + nl + nl + log_event(f"key {SECRET}", nl)
            + b"id: 4" + nl + progress_event(f"key {SECRET}", nl)
            + sse({"jsonrpc": "2.0", "id": 1, "result": {"note": SECRET}}, nl))
    rng = random.Random(3)
    for _ in range(20):
        relay = StreamRelay(chunks_of(pieces(body, rng)), closed,
                            call=Carried(1),
                            views=Views(rewrite=rewrite, notice=notice))
        assert await drain(relay) == body


async def test_notifications_are_redacted_as_they_arrive_and_others_pass_unchanged() -> None:
    rewrite, notice, c = guarded("redact")
    other = sse({"jsonrpc": "2.0", "method": "notifications/resources/updated",
                 "params": {"uri": "x://a"}})
    clean = progress_event("half way")
    body = log_event(f"key {SECRET}") + other + clean + progress_event(f"with {SECRET}") \
        + answer_event(1, f"and {SECRET}")
    relay = StreamRelay(chunks_of(split(body, 7)), closed,
                        call=Carried(1),
                        views=Views(rewrite=rewrite, notice=notice, hold_limit=1 << 20))
    out = await drain(relay)
    assert SECRET not in out.decode()
    events = [orjson.loads(e.partition(b"data: ")[2]) for e in out.split(b"\n\n") if e]
    assert [e.get("method") for e in events] == [
        "notifications/message", "notifications/resources/updated", "notifications/progress",
        "notifications/progress", None]
    assert events[0]["params"]["data"] == {"said": "key [REDACTED:secret]"}
    assert events[3]["params"]["message"] == "with [REDACTED:secret]"
    assert other in out and clean in out  # what no rule changes goes on as it came
    assert c.audit_note == ("guardrail g: redact secret in notifications/message; "
                            "guardrail g: redact secret in notifications/progress; "
                            "guardrail g: redact secret in result")


async def test_a_denied_notification_is_dropped_and_the_call_goes_on() -> None:
    rewrite, notice, c = guarded("deny")
    clean = log_event("starting")
    body = clean + log_event(f"key {SECRET}") + progress_event(SECRET) + answer_event(1, "ok")
    record = AuditRecord(endpoint="e")
    relay = StreamRelay(chunks_of([body]), closed,
                        call=Carried(1, exchange=exchange_of(record)),
                        views=Views(rewrite=rewrite, notice=notice, hold_limit=1 << 20))
    out = await drain(relay)
    assert out == clean + answer_event(1, "ok")
    assert relay.answered and record.status == "ok"
    assert c.audit_note == ("guardrail g: deny secret in notifications/message; "
                            "guardrail g: deny secret in notifications/progress")


async def test_after_the_answer_notifications_are_still_inspected() -> None:
    _, notice, _ = guarded("redact")
    body = answer_event(1, "ok") + log_event(SECRET) + b"data: not json\n\n"
    relay = StreamRelay(chunks_of([body]), closed,
                        call=Carried(1),
                        views=Views(notice=notice, hold_limit=1 << 20))
    out = await drain(relay)
    redacted = orjson.loads(out.split(b"\n\n")[1].partition(b"data: ")[2])
    assert out.startswith(answer_event(1, "ok")) and out.count(b"\n\n") == 2
    assert redacted["params"]["data"] == {"said": "[REDACTED:secret]"}
    assert SECRET not in out.decode() and b"not json" not in out


async def test_notifications_before_a_held_answer_reach_the_client_before_it() -> None:
    rewrite, notice, _ = guarded("redact")
    sent_answer = asyncio.Event()
    gate = asyncio.Event()

    async def upstream() -> AsyncIterator[bytes]:
        yield log_event(f"key {SECRET}")
        yield progress_event("half way")
        await gate.wait()  # the answer comes only once the client has read the notices
        sent_answer.set()
        yield answer_event(1, SECRET)

    relay = StreamRelay(upstream(), closed,
                        call=Carried(1),
                        views=Views(rewrite=rewrite, notice=notice, hold_limit=1 << 20))
    first = await asyncio.wait_for(relay.__anext__(), DEADLINE_S)
    second = await asyncio.wait_for(relay.__anext__(), DEADLINE_S)
    assert not sent_answer.is_set() and not relay.answered
    assert b"[REDACTED:secret]" in first and b"notifications/message" in first
    assert second == progress_event("half way")
    gate.set()
    last = await drain(relay)
    assert relay.answered and b"[REDACTED:secret]" in last and SECRET.encode() not in last


# -- a held stream holds only the answer ------------------------------------------------------

def big_notice(method: str, size: int, text: str = "") -> bytes:
    key = "data" if method == "notifications/message" else "message"
    return sse({"jsonrpc": "2.0", "method": method,
                "params": {"level": "info", key: text + "z" * size}})


@pytest.mark.parametrize("guarded_call", [False, True], ids=["held", "guardrail"])
async def test_a_large_event_that_is_not_the_answer_passes_on_as_it_arrives(
        guarded_call: bool) -> None:
    rewrite, notice = (guarded("redact")[:2] if guarded_call
                       else (lambda result: False, None))
    # over the held bound: a held event this large would end the call
    large = big_notice("notifications/resources/updated", 2 * HEAD_BYTES)
    gate = asyncio.Event()

    async def upstream() -> AsyncIterator[bytes]:
        yield large[:HEAD_BYTES + 100]
        await gate.wait()  # the rest of the event only once its start has reached the client
        for part in split(large[HEAD_BYTES + 100:]):
            yield part
        yield answer_event(1, "ok")

    record = AuditRecord(endpoint="e")
    relay = StreamRelay(upstream(), closed,
                        call=Carried(1, exchange=exchange_of(record)),
                        views=Views(rewrite=rewrite, notice=notice, hold_limit=HEAD_BYTES))
    head = await asyncio.wait_for(relay.__anext__(), DEADLINE_S)
    assert head == large[:HEAD_BYTES + 100] and relay.mid_event
    gate.set()
    assert head + await drain(relay) == large + answer_event(1, "ok")
    assert relay.answered and record.status == "ok"


async def test_a_large_notification_a_rule_reads_is_held_whole_and_bounded() -> None:
    rewrite, notice, _ = guarded("redact")
    within = big_notice("notifications/message", HEAD_BYTES // 2, f"key {SECRET} ")
    relay = StreamRelay(chunks_of(split(within + answer_event(1, "ok"))), closed,
                        call=Carried(1),
                        views=Views(rewrite=rewrite, notice=notice, hold_limit=HEAD_BYTES))
    out = await drain(relay)
    assert SECRET not in out.decode() and b"[REDACTED:secret]" in out and relay.answered
    over = big_notice("notifications/progress", 2 * HEAD_BYTES, f"key {SECRET} ")
    record = AuditRecord(endpoint="e")
    relay = StreamRelay(chunks_of(split(over + answer_event(1, "ok"))), closed,
                        call=Carried(1, exchange=exchange_of(record)),
                        views=Views(rewrite=rewrite, notice=notice, hold_limit=HEAD_BYTES))
    out = await drain(relay)
    assert SECRET not in out.decode() and not relay.answered
    error = orjson.loads(out.rpartition(b"data: ")[2])
    assert error["id"] == 1 and "server.max_response_bytes" in error["error"]["message"]
    assert record.status == "error"
