"""What a member of a virtual endpoint sends the client on a stream (a call's, or the merged
GET stream), and the client's answers back.

A server-to-client request (sampling, elicitation, roots) gets an id sealed to the member and
the client's session (`Cursors.seal_id`), which `respond` opens when the client answers, to
send the answer on to that member's session with the member's own id; a log message or a
progress notice names the member, a resource update the resource as the endpoint exposes it,
a task's status notice the task under the endpoint's id;
a member's `list_changed` is the endpoint's own.
"""

from __future__ import annotations

import logging
from typing import Any

import orjson

from proxy.chain import CallContext
from proxy.jsonrpc import McpMessage
from proxy.mcp.forward import Forwarder
from proxy.mcp.forwarding import Outgoing
from proxy.mcp.legs import Leg
from proxy.state import Session
from proxy.virtual import tasks, uris
from proxy.virtual.cursor import Cursors
from proxy.virtual.members import Members
from proxy.virtual.route import VirtualRoute

log = logging.getLogger("tollhouse.virtual")


class MemberRequests:
    """Each member's requests and notices to the client viewed, and the client's answers
    sent on to the member that asked."""

    def __init__(self, forward: Forwarder, cursors: Cursors, members: Members) -> None:
        self.forward = forward
        self.cursors = cursors
        self.members = members

    def views(self, route: VirtualRoute, leg: Leg, session: Session | None,
              ctx: CallContext) -> tuple[bool, Outgoing | None]:
        """What the relay does with a member's requests and notifications on a call's
        stream: a legacy member's request to a 2026-07-28 client ends the call, as on a plain
        endpoint's era bridge (nothing can carry the question; a legacy client's can); each
        is viewed (`view`: the member named, a request's id sealed)."""
        refuse = leg.bridged and ctx.era == "modern"
        if leg.route is None:  # answered without a member
            return refuse, None
        sealed_to = bound(session, ctx.principal.key)
        member = leg.route.name
        return refuse, lambda obj: self.view(route.name, member, sealed_to, obj)

    def view(self, endpoint: str, member: str, sealed_to: str, obj: dict[str, Any]) -> bool:
        """One message from `member` as the client gets it (True: changed)."""
        method = obj.get("method")
        if "id" in obj:  # a request to the client: answered under an id only we can open
            obj["id"] = self.cursors.seal_id(endpoint, sealed_to, member, obj["id"])
            return True
        params = obj.get("params")
        if not isinstance(params, dict):
            return False
        if method == "notifications/message":
            logger = params.get("logger")
            params["logger"] = f"{member}/{logger}" if isinstance(logger, str) and logger \
                else member
            return True
        if method == "notifications/progress":  # its progressToken is the client's own
            text = params.get("message")
            params["message"] = f"{member}: {text}" if isinstance(text, str) else member
            return True
        if method == "notifications/resources/updated":  # a resource as the endpoint names it
            return uris.updated(member, params)
        if method == "notifications/tasks/status":  # a task under the endpoint's id
            return tasks.notice(member, params)
        return False  # list_changed and the rest: as the endpoint's own, unchanged

    async def respond(self, route: VirtualRoute, msg: McpMessage, session: Session | None,
                      ctx: CallContext) -> None:
        """A client's answer to a member's request, sent on to that member's session with the
        member's own id. One under an id this endpoint did not give this session (forged,
        altered, another caller's) reaches no member: accepted and dropped, as a plain
        endpoint's upstream drops an answer to no request of its own."""
        opened = self.cursors.open_id(msg.id, route.name, bound(session, ctx.principal.key))
        if opened is None or opened[0] not in route.members \
                or not self.members.served(opened[0]):
            log.info("/mcp/%s: an answer to no member's request: dropped", route.name)
            return
        name, original = opened
        member = await self.members.route(route, name, session)
        body = orjson.loads(msg.body)
        body["id"] = original
        status = await self.forward.answer_held(member, ctx.principal, orjson.dumps(body))
        if status is None:  # the member session is gone, and the request with it
            log.info("/mcp/%s: an answer for member %s, whose session is gone: dropped",
                     route.name, name)
        elif status >= 300:
            log.info("/mcp/%s: member %s refused an answer: HTTP %d", route.name, name, status)


def bound(session: Session | None, caller: str) -> str:
    """What a sealed request id is bound to: the client's gateway session, else the caller."""
    return f"session {session.id}" if session is not None else f"caller {caller}"
