"""/api/v1/pins: the guardrails' tool definitions changed since they were pinned
(docs/guardrails.md). GET lists the changes waiting, each with a diff of the definition; approving one
makes it the pin (the tool is shown again), rejecting one keeps that definition hidden. Each
approval and rejection is one audit record: the change's own (`endpoint.audited`, endpoint
`/api/v1`), named here (method `pins/approve` or `pins/reject`, the tool; the hash decided and
the server in its note); a refused one keeps the generic `POST <path>` method."""

from __future__ import annotations

import difflib
from typing import Any

import orjson
from quart import Response

from policies.guardrails.pinning import Pin
from proxy.api.bodies import json_response
from proxy.api.caller import Caller
from proxy.api.context import Api
from proxy.audit import AuditRecord
from proxy.errors import Conflict, NotFound


def _item(pin: Pin) -> dict[str, Any]:
    return {"server": pin.endpoint, "tool": pin.name, "approved": pin.approved,
            "pending": pin.pending, "updated_at": pin.updated_at,
            "diff": _diff(pin.definition, pin.pending_definition or {})}


def _diff(old: dict[str, Any], new: dict[str, Any]) -> str:
    def lines(d: dict[str, Any]) -> list[str]:
        text = orjson.dumps(d, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS).decode()
        return text.splitlines(keepends=True)

    return "".join(difflib.unified_diff(lines(old), lines(new), "approved", "pending"))


async def pending(who: Caller, api: Api) -> Response:
    await _sync(api)
    pins = api.pins.pending() if api.pins is not None else []
    return json_response({"items": [_item(p) for p in pins]})


async def approve(who: Caller, api: Api, record: AuditRecord, server: str, tool: str
                  ) -> Response:
    return await _decide(api, record, server, tool, "approve")


async def reject(who: Caller, api: Api, record: AuditRecord, server: str, tool: str
                 ) -> Response:
    return await _decide(api, record, server, tool, "reject")


async def _sync(api: Api) -> None:
    """What every gateway on the database decided and recorded so far, as it is now."""
    if api.pin_store is not None:
        await api.pin_store.sync()


async def _decide(api: Api, record: AuditRecord, server: str, tool: str, decision: str
                  ) -> Response:
    await _sync(api)
    pin = api.pins.get(server, tool) if api.pins is not None else None
    digest = pin.pending if pin is not None else None
    decided = None
    if api.pins is not None and digest is not None:
        decided = api.pins.approve(server, tool) if decision == "approve" \
            else api.pins.reject(server, tool)
    if decided is None:
        raise NotFound(f"no changed definition of tool '{tool}' on server '{server}' waits")
    await _sync(api)  # durable before the answer, like every API change; and did it land?
    now = api.pins.get(server, tool) if api.pins is not None else None
    if api.pin_store is not None and (now is None or digest != (
            now.approved if decision == "approve" else now.rejected)):
        raise Conflict(f"tool '{tool}' on server '{server}' was decided or changed "
                       "meanwhile; list the pins again")
    verb = "approved" if decision == "approve" else "rejected"
    # the change's record (a management change, its principal the administrator) says which
    # decision it was, on which tool of which server
    record.method, record.tool = f"pins/{decision}", tool
    record.note = f"{verb} definition sha256:{digest} of server {server}"
    return json_response({"server": server, "tool": tool, "approved": decided.approved,
                          "rejected": decided.rejected})
