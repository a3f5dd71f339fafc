"""/api/v1/servers/{name}/status (a server's era, health and tools as the gateway last saw
them) and /api/v1/sessions (the live gateway sessions, per endpoint).

Health is read from the audit log, never kept apart: the server's records of the last
`RECENT_S` and of the last hour (`aggregates.health`). `state` says in one word what those
figures mean (README, "Server status"):

- "idle": no call to the server in the last `RECENT_S`;
- "failing": at least `FAILING_RATE` of those calls were errors, or the latest was one;
- "ok": otherwise.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from quart import Response

from proxy.api.audit import settled
from proxy.api.bodies import json_response
from proxy.api.caller import Caller
from proxy.api.context import Api
from proxy.audit import summary as aggregates

RECENT_S = 300  # the window `state` judges by
HOUR_S = 3600
FAILING_RATE = 0.5


def state_of(recent: dict[str, Any], last_ok_at: float | None,
             last_error_at: float | None) -> str:
    """The health rule (the module's docstring): from the last `RECENT_S`'s figures."""
    if not recent["calls"]:
        return "idle"
    latest_failed = last_error_at is not None and (last_ok_at is None
                                                   or last_error_at > last_ok_at)
    if recent["error_rate"] >= FAILING_RATE or latest_failed:
        return "failing"
    return "ok"


async def server_status(who: Caller, api: Api, name: str) -> Response:
    await api.registry.get(name)  # NotFound (404) for a server that does not exist
    assert api.seen is not None
    await settled(api)
    now = time.time()
    seen = await api.seen.get(name)
    health = await asyncio.to_thread(aggregates.health, api.database, endpoint=name,
                                     now=now, recent_s=RECENT_S, hour_s=HOUR_S)
    state = state_of(health["last_5m"], health["last_ok_at"], health["last_error_at"])
    return json_response({"name": name, "state": state, "era": seen["era"],
                          "era_seen_at": seen["era_seen_at"], "health": health,
                          "tools": seen["tools"], "tools_seen_at": seen["tools_seen_at"],
                          "at": now})


async def sessions(who: Caller, api: Api) -> Response:
    assert api.sessions is not None
    per = await api.sessions.by_endpoint()
    return json_response({"total": sum(per.values()), "scope": api.sessions_scope,
                          "endpoints": [{"endpoint": e, "sessions": n}
                                        for e, n in sorted(per.items())]})
