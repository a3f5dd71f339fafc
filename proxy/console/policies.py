"""The administrators' policies page (/console/policies): every Cedar policy the gateway
decides with (issue 37), the config file's and the API's, each with its source, mode and
@reason, and the calls it refused (enforce) and would have refused but let through (shadow)
over the last day, from the audit records (proxy.audit.summary.policy_denials).

Unlike the other pages, it reads the serving objects rather than /api/v1: the policies from
the Cedar gate in the live chain (what decides now, with its version), the counts through the
management API's `Api.aggregate` (its database and its cache of aggregates), since no /api/v1
route answers either yet."""

from __future__ import annotations

import time
from typing import Any

from quart import Response

from policies.cedar.gate import Gate
from policies.cedar.load import Policy
from proxy.api.audit import settled
from proxy.audit import summary as aggregates
from proxy.console.render import render
from proxy.held import held
from proxy.people.accounts import User
from proxy.people.signin import Web

DAY_S = 86400
API_FILE = "api"  # a policy created through /api/v1/policies (proxy.policy_store.FILE)


def _minute() -> float:
    """The end of this minute: the day ends there, so that the aggregate (cached for
    seconds) serves every reload within the minute."""
    return float((int(time.time()) // 60 + 1) * 60)


def _gate() -> Gate | None:
    """The Cedar gate of the live chain (None: no policy was configured here)."""
    serving = held().serving
    if serving is None:
        return None
    return serving.gateway.live.gate


def _row(policy: Policy, counts: dict[str, Any] | None, pending: tuple[str, ...]
         ) -> dict[str, Any]:
    return {"id": policy.id, "source": API_FILE if policy.file == API_FILE else policy.file,
            "mode": policy.mode, "reason": policy.reason, "pending": policy.id in pending,
            "enforce": counts["enforce"] if counts else 0,
            "shadow": counts["shadow"] if counts else 0}


async def policies(web: Web, user: User) -> Response:
    gate = _gate()
    if gate is not None:
        gate.refresh()  # a change made through another replica's API, taken now
    if gate is None or not gate.policies:
        return await render("policies.html", user, rows=[], gone=[], version=None)
    serving = held().serving
    assert serving is not None  # a gate is only found while serving
    until = _minute()
    await settled(serving.api)  # this process's calls counted: their records committed first
    day = await serving.api.aggregate(aggregates.policy_denials, since=until - DAY_S,
                                      until=until)
    counts = {item["policy"]: item for item in day["items"]}
    rows = [_row(p, counts.pop(p.id, None), gate.pending)
            for p in sorted(gate.policies, key=lambda p: p.id)]
    no_permit = counts.pop(aggregates.NO_PERMIT, None)
    return await render("policies.html", user, rows=rows, version=gate.version,
                        no_permit=no_permit, errors=day["errors"],
                        shadow_errors=day["shadow_errors"], since=day["since"],
                        until=day["until"],
                        gone=[counts[k] for k in sorted(counts)])  # no longer loaded
