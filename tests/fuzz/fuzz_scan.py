"""The scan of an answer streamed through (proxy.mcp.scan.AnswerScan) and of an SSE event
passed on as it arrives (proxy.mcp.sse.LargeEvent): what the gateway learns of a call from
bytes it does not hold.

Input: the first byte picks the chunk size the bytes arrive in (0: one chunk), the second
byte's low bit whether they are one JSON message or one SSE event's lines; the rest are the
bytes. Holds: no exception; the answer does not depend on the chunking; for a message that
is one JSON object, the scan learns what the parsed object says (its id, result or error and
the error's code, the result's isError, each when small enough to keep), as `response_outcome`
reads it; for an event, it ends where the client's event ends and its data is scanned as the
client dispatches it.
"""

from __future__ import annotations

from typing import Any

import orjson

from proxy.mcp.scan import CAPTURE_BYTES, AnswerScan
from proxy.mcp.sse import EventSplitter, LargeEvent, event_data


def _pieces(data: bytes, size: int) -> list[bytes]:
    step = size or max(1, len(data))
    return [data[i:i + step] for i in range(0, len(data), step)] or [b""]


def _kept(value: Any) -> Any:
    """A value as the scan keeps it: itself when its JSON is small, else an empty object."""
    return value if len(orjson.dumps(value)) <= CAPTURE_BYTES else {}


def _expected(msg: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {k: True for k in ("jsonrpc", "method") if k in msg}
    if "id" in msg:
        out["id"] = _kept(msg["id"])
    if "error" in msg:
        error = msg["error"]
        out["error"] = {"code": _kept(error["code"])} \
            if isinstance(error, dict) and "code" in error else {}
    if "result" in msg:
        result = msg["result"]
        out["result"] = {"isError": _kept(result["isError"])} \
            if isinstance(result, dict) and "isError" in result else {}
    return out


def _scan(pieces: list[bytes]) -> dict[str, Any] | None:
    scan = AnswerScan()
    for piece in pieces:
        scan.feed(piece)
    return scan.message()


def _event(data: bytes, size: int) -> None:
    data = data.lstrip(b"\r\n")  # as the relay hands it over: no line end of an earlier event
    large = LargeEvent(AnswerScan())
    end = None
    fed = 0
    for piece in _pieces(data, size):
        end = large.feed(piece)
        if end is not None:
            end += fed
            break
        fed += len(piece)
    whole = EventSplitter().feed(data)
    if not whole:  # no event ends in these bytes for the client either
        assert end is None
        return
    first = whole[0]
    # a CR ending the blank line may end the event at once: the LF after it, the rest of a
    # CRLF, is then the next event's first byte, which a client skips
    assert end == len(first) or (end == len(first) - 1 and first.endswith(b"\r\n")), \
        (end, len(first))
    assert large.scan is not None
    seen = large.scan.message()
    try:
        msg = orjson.loads(event_data(first))
    except orjson.JSONDecodeError:
        return
    if isinstance(msg, dict):
        assert seen == _expected(msg), (seen, msg)


def check(data: bytes) -> None:
    if len(data) < 2:
        return
    size, sse, body = data[0], data[1] & 1, data[2:]
    if sse:
        _event(body, size)
        return
    seen = _scan(_pieces(body, size))
    assert seen == _scan([body])
    try:
        msg = orjson.loads(body)
    except orjson.JSONDecodeError:
        return
    if isinstance(msg, dict):
        assert seen == _expected(msg), (seen, msg)
    else:
        assert seen is None
