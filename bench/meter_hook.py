"""An in-process metering hook for `run.py --metered`: allows every call and takes every usage
event (`metering.hook = "meter_hook:HOOK"`; run.py puts bench/ on the gateway's PYTHONPATH).
With it each `tools/call` is authorized, audited and gets a usage event in the outbox that the
outbox worker delivers here: the metered, audited path, with no receiver's latency in it."""

from __future__ import annotations

from typing import Any


class AllowAll:
    def __init__(self) -> None:
        self.recorded = 0

    async def authorize(self, request: dict[str, Any]) -> dict[str, Any]:
        return {"allow": True}

    async def record(self, event: dict[str, Any]) -> None:
        self.recorded += 1


HOOK = AllowAll()
