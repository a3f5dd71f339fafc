"""The relay of an upstream's SSE answer to a client (proxy.mcp.relay.StreamRelay), the reader
of the upstream stream: it follows the call through each event's data, rewrites the result a
policy filters, and ends a call the upstream left unanswered with one error event.

Input: the first byte picks the chunk size the stream arrives in (0: one chunk), the second
the call (bit 0: a policy rewrites the result, bit 1: a 2026-07-28 caller, who can answer no
upstream request, bit 2: the request id is the string "1" rather than the integer 1), the rest
is the upstream's stream. Holds, read as a client reads the bytes it is sent: the call gets an
answer; the first answer to it carries the rewritten result when a policy rewrites it; an
error the gateway adds is the last event, whole, seed 004's -32000 for this id, and follows no
answer; the audit record says error exactly when the client's answer is an error.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import orjson

from proxy.audit import AuditRecord, MemoryAuditSink
from proxy.mcp.exchange import Exchange
from proxy.mcp.relay import Carried, StreamRelay, Views
from proxy.observability import Observers
from tests.fuzz.fuzz_sse import dispatched


async def _chunks(stream: bytes, size: int) -> AsyncIterator[bytes]:
    step = size or max(1, len(stream))
    for start in range(0, len(stream), step):
        yield stream[start:start + step]


async def _close() -> None:
    return None


def _rewrite(result: dict[str, Any]) -> bool:
    result["rewritten"] = True
    return True


def _drain(relay: StreamRelay) -> list[bytes]:
    """The relay's body, driven without an event loop: nothing in it waits on I/O here."""
    out: list[bytes] = []
    while True:
        step = relay.__anext__()
        try:
            step.send(None)
        except StopIteration as done:
            out.append(done.value)
            continue
        except StopAsyncIteration:
            return out
        step.close()
        raise AssertionError("the relay waited on something")


def _answers(data: list[bytes], request_id: Any) -> list[dict[str, Any]]:
    """The messages a client takes as the answer to its request: same id, same type."""
    out = []
    for item in data:
        try:
            obj = orjson.loads(item)
        except orjson.JSONDecodeError:
            continue
        if isinstance(obj, dict) and "method" not in obj and type(obj.get("id")) is \
                type(request_id) and obj["id"] == request_id and ("result" in obj
                                                                  or "error" in obj):
            out.append(obj)
    return out


def check(data: bytes) -> None:
    if len(data) < 2:
        return
    chunk, flags, stream = data[0] % 32, data[1], data[2:]
    request_id: Any = "1" if flags & 4 else 1
    record = AuditRecord(endpoint="e")
    relay = StreamRelay(_chunks(stream, chunk), _close,
                        call=Carried(request_id, Exchange(record, MemoryAuditSink(), Observers())),
                        views=Views(rewrite=_rewrite if flags & 1 else None,
                                    refuse_requests=bool(flags & 2)))
    sent = _drain(relay)
    seen = dispatched(b"".join(sent))
    answers = _answers(seen, request_id)
    assert answers, (sent, seen)
    first = answers[0]
    added = not relay.answered  # drained, unanswered: the gateway ended it itself
    if added:
        assert len(answers) == 1 and seen[-1] == sent[-1].split(b"data: ", 1)[1][:-2]
        assert sent[-1].startswith(b"event: message\ndata: ")
        assert set(first) == {"jsonrpc", "id", "error"} and first["error"]["code"] == -32000
        assert set(first["error"]) == {"code", "message"}
    elif flags & 1 and isinstance(first.get("result"), dict):
        assert first["result"].get("rewritten") is True, first
    assert (record.status == "error") == ("error" in first), (record.status, first)
    assert record.bytes_out == sum(map(len, sent))
