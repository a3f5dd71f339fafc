"""Server-sent events, split into whole events as they arrive.

The relay forwards each upstream event as the bytes it arrived as (ids, retry fields and line
endings untouched) and reads its `data` to follow the call; splitting on whole events means an
error event the gateway appends never lands inside a half-sent upstream event.
"""

from __future__ import annotations

import re

# An event ends at a blank line: two line ends in a row, each CRLF, LF or CR (HTML, "Interpreting
# an event stream"), so any mix of them. A CR that may be the first half of a CRLF does not end
# the first line until the next byte says which; a CR ending the blank line ends the event at
# once, as it does for a client, and an LF arriving after it (the rest of that CRLF, which a
# client skips) begins the next event's bytes.
_BOUNDARY = re.compile(rb"(?:\r\n|\n|\r(?!\n))(?:\r\n|\n|\r)")


class EventSplitter:
    __slots__ = ("_buf", "max_event_bytes")

    def __init__(self, max_event_bytes: int = 16 * 1024 * 1024) -> None:
        self._buf = b""
        self.max_event_bytes = max_event_bytes

    def feed(self, chunk: bytes) -> list[bytes]:
        """Whole events (each with its terminating blank line) completed by `chunk`."""
        buf = self._buf + chunk if self._buf else chunk
        events: list[bytes] = []
        start = 0
        for match in _BOUNDARY.finditer(buf):
            events.append(buf[start:match.end()])
            start = match.end()
        self._buf = buf[start:]
        if len(self._buf) > self.max_event_bytes:
            raise ValueError("SSE event exceeds the size limit")
        return events

    @property
    def pending(self) -> bytes:
        return self._buf


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


def _is_data(line: bytes) -> bool:
    """A `data` field: `data: value`, or `data` alone, whose value is empty."""
    return line.startswith(b"data:") or line == b"data"
