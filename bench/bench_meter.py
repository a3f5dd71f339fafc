"""The in-process metering hook of bench/paths.py's `all-policies` target
(`metering.hook = "bench_meter:METER"`): allows every call and counts the usage events it is
given, as a billing system's client library would, without a network hop."""

from __future__ import annotations

from typing import Any


class Meter:
    def __init__(self) -> None:
        self.events = 0

    async def authorize(self, request: dict[str, Any]) -> dict[str, Any]:
        return {"allow": True}

    async def record(self, event: dict[str, Any]) -> None:
        self.events += 1


METER = Meter()
