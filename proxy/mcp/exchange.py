"""The edge's plain view of one HTTP exchange: what the gateway's spine reads and answers,
free of the web framework."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field


@dataclass(slots=True)
class EdgeRequest:
    headers: Mapping[str, str]
    read_body: Callable[[], Awaitable[bytes]]
    peer: str | None = None
    duplicated: frozenset[str] = frozenset()  # header names sent more than once
    forwarded: tuple[tuple[str, str], ...] = ()  # every X-Forwarded-For / Forwarded line


@dataclass(slots=True)
class EdgeResponse:
    status: int
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    stream: AsyncIterator[bytes] | None = None
