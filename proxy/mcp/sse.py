"""Server-sent events, split into whole events as they arrive.

The relay forwards each upstream event as the bytes it arrived as (ids, retry fields and line
endings untouched) and reads its `data` to follow the call; splitting on whole events means an
error event the gateway appends never lands inside a half-sent upstream event.
"""

from __future__ import annotations

import re

_BOUNDARY = re.compile(rb"\r\n\r\n|\n\n|\r\r|\r\n\n|\n\r\n")


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
    kept = [line for line in event.splitlines() if line and not line.startswith(b"data:")]
    return b"\n".join([*kept, b"data: " + data]) + b"\n\n"


def event_data(event: bytes) -> bytes:
    """The `data` of one event, its lines joined with LF; b"" when it has none."""
    parts: list[bytes] = []
    for line in event.splitlines():
        if line.startswith(b"data:"):
            value = line[5:]
            parts.append(value[1:] if value.startswith(b" ") else value)
    return b"\n".join(parts)
