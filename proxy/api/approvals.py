"""/api/v1/approvals: the calls held for a person's yes (proxy/approvals.py), listed, read,
approved and denied.

Who may call: a person with a browser session or with the bearer JWT the MCP edge accepts for
them (`Route.approver`: proxy.api.caller), and the management API's keys. What each sees: an
approval's approvers (`[[approvals]] approvers`: "user:<subject>", "group:<group>", "self" the
caller) see and decide it; administrators and auditors read every approval and decide only
those that name them. A decision by anyone else is 403; one on an approval decided already
409 (`conflict`), past its time 409 (`expired`); an id that is not one 404. The approval a
person may not read answers 403 (its id is unguessable: 404 would tell nothing more).
"""

from __future__ import annotations

from typing import Any

from pydantic import Field
from quart import Response, request

from proxy.api.bodies import json_response, read
from proxy.api.caller import Caller
from proxy.api.context import Api
from proxy.approvals import COMMENT_MAX, Approvals, Approver, may_decide, public
from proxy.errors import Conflict, NotFound, NotPermitted, StoreUnavailable
from proxy.state.approvals import Approval
from proxy.strict import Strict


class DecisionIn(Strict):
    """An approver's decision: a comment, shown to the caller when they refuse."""

    comment: str = Field(default="", max_length=COMMENT_MAX)


def approver(who: Caller) -> Approver:
    return Approver(who.subject, who.groups, who.name, issuer=who.issuer)


def reads(who: Caller, approval: Approval) -> bool:
    """Whether `who` may see `approval`: its approvers, administrators and auditors."""
    return who.admin or who.auditor or may_decide(approval, approver(who))


def shown(api: Api, approval: Approval) -> dict[str, Any]:
    return {**public(approval), "url": _live(api).link(approval.id)}


def _live(api: Api) -> Approvals:
    if api.approvals is None:  # built with the app: only a test's bare Api lacks it
        raise StoreUnavailable("approvals are not served by this process")
    return api.approvals


async def _found(api: Api, who: Caller, approval_id: str) -> Approval:
    found = await _live(api).store.get(approval_id)
    if found is None:
        raise NotFound(f"approval '{approval_id[:80]}' not found")
    if not reads(who, found):
        raise NotPermitted("you are not an approver of this approval")
    return found


async def approvals(who: Caller, api: Api) -> Response:
    """GET: the pending approvals `who` may see, oldest first (`?endpoint=` one endpoint's)."""
    endpoint = request.args.get("endpoint")
    found = await _live(api).store.pending()
    return json_response({"items": [
        shown(api, a) for a in found
        if reads(who, a) and (endpoint is None or a.endpoint == endpoint)]})


async def approval(who: Caller, api: Api, approval_id: str) -> Response:
    return json_response(shown(api, await _found(api, who, approval_id)))


async def approve_approval(who: Caller, api: Api, approval_id: str) -> Response:
    return await _decide(who, api, approval_id, True)


async def deny_approval(who: Caller, api: Api, approval_id: str) -> Response:
    return await _decide(who, api, approval_id, False)


async def _decide(who: Caller, api: Api, approval_id: str, yes: bool) -> Response:
    body = await read(DecisionIn) if await request.get_data() else DecisionIn()
    kind, decided = await _live(api).decide(approval_id, yes, approver(who), body.comment)
    if kind == "missing" or decided is None:
        raise NotFound(f"approval '{approval_id[:80]}' not found")
    if kind == "forbidden":
        raise NotPermitted("you are not an approver of this approval")
    if kind == "conflict":
        raise Conflict(f"approval '{approval_id}' was {decided.status} already")
    if kind == "expired":
        raise Conflict(f"approval '{approval_id}' expired")
    return json_response(shown(api, decided))
