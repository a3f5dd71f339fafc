"""The console's Approvals pages: the calls held for a person's yes that this person may see
(`/console/approvals`: caller, endpoint, tool, the arguments shown to approvers, age) and one
approval (`/console/approvals/<id>`: the URL a held call's pending result points at), each
with approve and deny and a comment. Everything goes through /api/v1/approvals as the person
(proxy.api.approvals decides who sees and who decides); the pages render what it answers. The
caller is shown as every page shows a principal (proxy.console.names) to administrators and
auditors, who may read /api/v1/principals and the audit log it links to; others see the
caller as recorded."""

from __future__ import annotations

import time
from typing import Any

import orjson
from quart import Response, request

from proxy.console.api import call
from proxy.console.names import names
from proxy.console.records import Links
from proxy.console.render import after, render
from proxy.people.accounts import User
from proxy.people.signin import Web
from proxy.web.paths import segment


def age(created_at: float, now: float) -> str:
    """How long ago an approval was asked for, in the largest whole unit."""
    seconds = max(0, int(now - created_at))
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds // size} {unit}"
    return f"{seconds} s"


def _view(item: dict[str, Any], now: float) -> dict[str, Any]:
    return {**item, "age": age(float(item.get("created_at") or now), now),
            "shown": orjson.dumps(item.get("arguments") or {},
                                  option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS).decode()}


async def _callers(web: Web, user: User, items: list[dict[str, Any]]) -> dict[str, Any]:
    """The names of the approvals' callers (and deciders) and the link to their calls, for
    those who may read
    them (nothing asked for anyone else: /api/v1/principals would refuse them)."""
    if not (user.is_admin or user.is_auditor):
        return {"who": {}, "link": None}
    return {"who": await names(web, [p for i in items
                                      for p in (i.get("caller"), i.get("decided_by"))]),
            "link": Links("/console/audit", {})}


async def approvals(web: Web, user: User) -> Response:
    answer = await call(web, "GET", "/approvals")
    if not answer.ok:
        return await render("message.html", user, max(answer.status, 400),
                            title="Approvals", message=answer.detail)
    now = time.time()
    items = answer.body.get("items", [])
    return await render("approvals.html", user, items=[_view(i, now) for i in items],
                        **await _callers(web, user, items))


async def approval(web: Web, user: User, approval_id: str) -> Response:
    answer = await call(web, "GET", f"/approvals/{segment(approval_id)}")
    if not answer.ok:  # unknown (404) or not theirs to see (403): the API's words
        return await render("message.html", user, max(answer.status, 400),
                            title="Approval", message=answer.detail,
                            back="/console/approvals")
    return await render("approval.html", user, a=_view(answer.body, time.time()),
                        **await _callers(web, user, [answer.body]))


async def approve(web: Web, user: User, approval_id: str) -> Response:
    return await _decide(web, user, approval_id, "approve")


async def deny(web: Web, user: User, approval_id: str) -> Response:
    return await _decide(web, user, approval_id, "deny")


async def _decide(web: Web, user: User, approval_id: str, verb: str) -> Response:
    form = await request.form
    answer = await call(web, "POST", f"/approvals/{segment(approval_id)}/{verb}",
                        json={"comment": form.get("comment", "")})
    return await after(answer, user, f"/console/approvals/{segment(approval_id)}",
                       "approved" if verb == "approve" else "denied")
