"""Server-sent events, split into whole events as they arrive.

The relay forwards each upstream event as the bytes it arrived as (ids, retry fields and line
endings untouched) and reads its `data` to follow the call; splitting on whole events means an
error event the gateway appends never lands inside a half-sent upstream event. An event that
outgrows `HEAD_BYTES` and that no policy rewrites is not held: a `LargeEvent` passes it on as
it arrives, its data read by an `AnswerScan` on the way.
"""

from __future__ import annotations

import re
from typing import Any

import orjson

from proxy.mcp.scan import AnswerScan

# An event this large is passed on as it arrives (when nothing rewrites it), not held whole.
HEAD_BYTES = 256 * 1024

# An event ends at a blank line: two line ends in a row, each CRLF, LF or CR (HTML, "Interpreting
# an event stream"), so any mix of them. A CR that may be the first half of a CRLF does not end
# the first line until the next byte says which; a CR ending the blank line ends the event at
# once, as it does for a client, and an LF arriving after it (the rest of that CRLF, which a
# client skips) begins the next event's bytes.
_BOUNDARY = re.compile(rb"(?:\r\n|\n|\r(?!\n))(?:\r\n|\n|\r)")


class EventSplitter:
    """Whole events out of chunks. The unfinished event's bytes grow in place and each chunk
    is searched only from where a boundary could begin (a boundary is at most 4 bytes): an
    event that arrives in many chunks costs its size once, not its size times its chunks."""

    __slots__ = ("_buf", "max_event_bytes")

    def __init__(self, max_event_bytes: int = 16 * 1024 * 1024) -> None:
        self._buf = bytearray()
        self.max_event_bytes = max_event_bytes

    def feed(self, chunk: bytes) -> list[bytes]:
        """Whole events (each with its terminating blank line) completed by `chunk`."""
        events: list[bytes] = []
        if not self._buf:  # the common case: events cut from the chunk itself
            start = 0
            for match in _BOUNDARY.finditer(chunk):
                events.append(chunk[start:match.end()])
                start = match.end()
            if start < len(chunk):
                self._buf += memoryview(chunk)[start:]
        else:
            buf = self._buf
            searched = max(0, len(buf) - 3)  # no boundary ends in what came before
            buf += chunk
            start = 0
            for match in _BOUNDARY.finditer(buf, searched):
                events.append(bytes(buf[start:match.end()]))
                start = match.end()
            if start:
                del buf[:start]
        if len(self._buf) > self.max_event_bytes:
            raise ValueError("SSE event exceeds the size limit")
        return events

    @property
    def pending(self) -> bytes:
        """A copy of the unfinished event's bytes so far (`pending_size` for its length)."""
        return bytes(self._buf)

    @property
    def pending_size(self) -> int:
        return len(self._buf)

    def take(self) -> bytes:
        """The unfinished event's bytes so far, handed to a `LargeEvent`."""
        buf, self._buf = bytes(self._buf), bytearray()
        return buf


_LINE_END = re.compile(rb"\r\n|\r|\n")


class LargeEvent:
    """One event passed on as it arrives: `feed` says where in a chunk the event ended (None
    while it goes on), and gives the data of its `data` lines (joined with LF, the one space
    after the colon dropped) to `scan`, when there is one."""

    __slots__ = ("_cr", "_data_lines", "_field", "_head", "_line_bytes", "_space", "scan")

    def __init__(self, scan: AnswerScan | None) -> None:
        self.scan = scan
        self._cr = False  # the last byte was a CR: an LF next is the rest of that line end
        self._head = b""  # the start of the current line, until its field name is known
        self._field: bool | None = None  # a data line (True), another field (False), unknown
        self._space = False  # a data line whose value may still begin with the one space
        self._line_bytes = 0
        self._data_lines = 0

    def feed(self, chunk: bytes) -> int | None:
        i, n = 0, len(chunk)
        if self._cr and n and chunk[0] == 0x0A:
            i = 1
        self._cr = False
        while i < n:
            m = _LINE_END.search(chunk, i)
            end = m.start() if m is not None else n
            if end > i:
                self._line(chunk[i:end])
            if m is None:
                return None
            if self._line_bytes == 0:  # a blank line: the event ends here
                return m.end()
            self._line_bytes, self._field, self._head = 0, None, b""
            if m.group() == b"\r" and m.end() == n:
                self._cr = True
            i = m.end()
        return None

    def _line(self, part: bytes) -> None:
        self._line_bytes += len(part)
        if self._field is None:
            self._head += part
            if len(self._head) < 5 and not self._head.startswith(b"data"[: len(self._head)]):
                self._field = False
                return
            if len(self._head) < 5:
                return
            self._field = self._head.startswith(b"data:")
            if not self._field:
                return
            part, self._head, self._space = self._head[5:], b"", True
            if self.scan is not None and self._data_lines:
                self.scan.feed(b"\n")
            self._data_lines += 1
        if not self._field or self.scan is None or not part:
            return
        if self._space:
            self._space = False
            if part[0] == 0x20:
                part = part[1:]
        self.scan.feed(part)


def with_data(event: bytes, data: bytes) -> bytes:
    """The same event (its id and other fields kept) carrying `data` instead."""
    kept = [line for line in event.splitlines() if line and not _is_data(line)]
    return b"\n".join([*kept, b"data: " + data]) + b"\n\n"


def event_data(event: bytes) -> bytes:
    """The `data` of one event, its lines joined with LF; b"" when it has none."""
    parts: list[bytes] = []
    for line in event.splitlines():
        if _is_data(line):
            value = line[5:]
            parts.append(value[1:] if value.startswith(b" ") else value)
    return b"\n".join(parts)


def event_object(event: bytes) -> dict[str, Any] | None:
    """The JSON object an event's `data` carries; None for an event with no data, or data that
    is not a JSON object."""
    data = event_data(event)
    if not data:
        return None
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    return obj if isinstance(obj, dict) else None


def _is_data(line: bytes) -> bool:
    """A `data` field: `data: value`, or `data` alone, whose value is empty."""
    return line.startswith(b"data:") or line == b"data"
