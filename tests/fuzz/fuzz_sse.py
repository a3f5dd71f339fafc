"""The SSE splitter the relay and the bridge read upstream streams with (proxy.mcp.sse), held
to the event-stream interpretation of the HTML standard, the one the client applies to the
same bytes.

Input: the first byte picks the chunk size the stream arrives in (0: one chunk), the second the
size limit (0: the default), the rest is the upstream's stream. Holds: nothing is lost (the
events and the pending tail are the stream); each event is whole (split again, it is itself);
each event's data, as the gateway reads it, is the data the client dispatches for it, and the
tail holds back nothing the client would already dispatch; the answer does not depend on the
chunking; the only exception is the size limit's ValueError, raised when the tail is over it;
an event whose data the gateway rewrites carries exactly the new data and stays one event.
"""

from __future__ import annotations

import re

import orjson

from proxy.mcp.sse import EventSplitter, event_data, with_data

_LINE_END = re.compile(rb"\r\n|\r|\n")


def dispatched(stream: bytes) -> list[bytes]:
    """The data of each event a client dispatches from `stream` (HTML, "Interpreting an event
    stream"; the last, unterminated line is not processed yet)."""
    out: list[bytes] = []
    buffer = b""
    lines = _LINE_END.split(stream)[:-1]
    for line in lines:
        if not line:
            if buffer:
                out.append(buffer[:-1])
            buffer = b""
            continue
        if line.startswith(b":"):
            continue
        name, colon, value = line.partition(b":")
        if colon and value.startswith(b" "):
            value = value[1:]
        if name == b"data":
            buffer += value + b"\n"
    return out


def split(stream: bytes, chunk: int, limit: int) -> tuple[list[bytes], bytes, bool]:
    splitter = EventSplitter(limit)
    events: list[bytes] = []
    fed = 0
    step = chunk or max(1, len(stream))
    try:
        while fed < len(stream):
            events.extend(splitter.feed(stream[fed:fed + step]))
            fed += step
    except ValueError:
        assert len(splitter.pending) > limit
        return events, splitter.pending, True
    return events, splitter.pending, False


def check(data: bytes) -> None:
    if len(data) < 2:
        return
    chunk, limit = data[0] % 32, (data[1] * 8 or 16 * 1024 * 1024)
    stream = data[2:]
    events, pending, over = split(stream, chunk, limit)
    consumed = b"".join(events) + pending
    # over the limit, the call ends (an error event): the feed that raised returns nothing
    assert over or consumed == stream
    client: list[bytes] = []
    for event in events:
        assert EventSplitter().feed(event) == [event], event
        seen = dispatched(event)
        assert len(seen) <= 1, (event, seen)
        assert event_data(event) == (seen[0] if seen else b""), (event, seen)
        client.extend(seen)
        new = orjson.dumps({"jsonrpc": "2.0", "id": 1, "result": {"n": len(event)}})
        rewritten = with_data(event, new)
        assert EventSplitter().feed(rewritten) == [rewritten]
        assert dispatched(rewritten) == [new] and event_data(rewritten) == new, rewritten
    if over:
        return
    assert dispatched(pending) == [], pending
    assert client == dispatched(consumed)
    if not over and chunk:
        whole, rest, whole_over = split(stream, 0, limit)
        # (the tails may differ by the LF of a CRLF split after its CR, one byte over a limit)
        if not whole_over:
            assert [d for e in whole for d in dispatched(e)] == client
            assert dispatched(rest) == []
