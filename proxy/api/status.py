"""/api/v1/servers/{name}/status (a server's era, health and tools as the gateway last saw
them), /api/v1/server-status (the same of up to `MAX_NAMES` servers at once, in a fixed number
of reads) and /api/v1/sessions (the live gateway sessions, per endpoint).

Health is read from the audit log, never kept apart: the server's records of the last
`RECENT_S` and of the last hour (`aggregates.health`). `state` says in one word what those
figures mean (docs/management-api.md):

- "idle": no call to the server in the last `RECENT_S`;
- "failing": at least `FAILING_RATE` of those calls were errors, or the latest was one;
- "ok": otherwise.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from quart import Response, request

from proxy.api.audit import settled
from proxy.api.bodies import json_response
from proxy.api.caller import Caller
from proxy.api.context import Api
from proxy.audit import summary as aggregates
from proxy.errors import Invalid

RECENT_S = 300  # the window `state` judges by
HOUR_S = 3600
FAILING_RATE = 0.5
# servers in one /server-status read: a page of the console's list; 100 names of up to 64
# characters keep the request line under the 16 KB servers commonly allow
MAX_NAMES = aggregates.MAX_HEALTHS


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


def _status(name: str, seen: dict[str, Any], health: dict[str, Any], now: float
            ) -> dict[str, Any]:
    state = state_of(health["last_5m"], health["last_ok_at"], health["last_error_at"])
    return {"name": name, "state": state, "era": seen["era"],
            "era_seen_at": seen["era_seen_at"], "health": health, "tools": seen["tools"],
            "tools_seen_at": seen["tools_seen_at"], "at": now}


async def server_status(who: Caller, api: Api, name: str) -> Response:
    await api.registry.get(name)  # NotFound (404) for a server that does not exist
    assert api.seen is not None
    await settled(api)
    now = time.time()
    seen = await api.seen.get(name)
    health = await asyncio.to_thread(aggregates.health, api.database, endpoint=name,
                                     now=now, recent_s=RECENT_S, hour_s=HOUR_S)
    return json_response(_status(name, seen, health, now))


async def server_statuses(who: Caller, api: Api) -> Response:
    """GET /api/v1/server-status?name=a&name=b: each named server's status, as
    /servers/{name}/status answers it, in the order named (a name twice: once), in one read
    of the audit log and one of what was last seen; names of no server are listed apart."""
    asked = request.args.getlist("name")
    if not asked or len(asked) > MAX_NAMES:
        raise Invalid([{"loc": ["query", "name"], "msg": "name a server (name=...)" if not asked
                        else f"at most {MAX_NAMES} names in one request",
                        "type": "value_error"}])
    names = list(dict.fromkeys(asked))
    assert api.seen is not None
    known = await api.registry.names()
    found = [n for n in names if n in known]
    await settled(api)
    now = time.time()
    seen = await api.seen.get_many(found)
    health = await asyncio.to_thread(aggregates.healths, api.database, endpoints=found,
                                     now=now, recent_s=RECENT_S, hour_s=HOUR_S)
    return json_response({"items": [_status(n, seen[n], health[n], now) for n in found],
                          "not_found": [n for n in names if n not in known]})


async def sessions(who: Caller, api: Api) -> Response:
    assert api.sessions is not None
    per = await api.sessions.by_endpoint()
    return json_response({"total": sum(per.values()), "scope": api.sessions_scope,
                          "endpoints": [{"endpoint": e, "sessions": n}
                                        for e, n in sorted(per.items())]})
