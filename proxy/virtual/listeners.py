"""The GET streams open on virtual endpoints, and the client listening on each: a legacy
client's stream merged from its members' GET streams (proxy/virtual/listen.py `Merged`), each
on the member session held for the client's gateway session, and kept in step when an
endpoint's members change (told, a member that joined listened to, one that left no more).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from functools import partial

from proxy.auth.principal import Principal
from proxy.errors import Draining, GatewayError
from proxy.mcp.forward import Forwarder
from proxy.mcp.forwarding import Listened, NoStream, Outgoing
from proxy.state import Session
from proxy.upstream import UpstreamAnswer
from proxy.virtual.listen import Merged
from proxy.virtual.members import Members
from proxy.virtual.outgoing import MemberRequests, bound
from proxy.virtual.route import VirtualRoute

log = logging.getLogger("tollhouse.virtual")


class Listeners:
    """The merged GET streams open now, with the gateway session and caller of each."""

    def __init__(self, forward: Forwarder, members: Members, requests: MemberRequests) -> None:
        self.forward = forward
        self.members = members
        self.requests = requests  # each member's messages viewed as on a call's stream
        self._listening: dict[Merged, tuple[Session, Principal]] = {}

    async def listen(self, route: VirtualRoute, session: Session | None, principal: Principal,
                     draining: bool) -> Listened | NoStream:
        """The members' GET streams merged (proxy/virtual/listen.py), for a gateway session:
        none without one."""
        if session is None:
            return NoStream({"Allow": "POST, DELETE"},
                            "no GET stream without a session on a virtual endpoint")
        if draining:
            raise Draining()
        merged = await self._merge(route, session, principal)
        return Listened(merged, merged.aclose, stopped=partial(self.stopped, merged))

    async def _merge(self, route: VirtualRoute, session: Session, principal: Principal
                     ) -> Merged:
        """The merged GET stream of the legacy members, each on the member session held for
        this gateway session (opened now if there is none). A member that offers no GET
        stream, or fails to open one, is left out (logged); a 2026-07-28 member has none."""
        merged = Merged(route.name, self.members.present(route.members))
        self._listening[merged] = (session, principal)  # a change meanwhile is followed too
        try:
            opened = await asyncio.gather(*(self._member_stream(route, name, session,
                                                                principal)
                                            for name in merged.members))
        except BaseException:
            self.stopped(merged)
            await merged.aclose()
            raise
        sealed_to = bound(session, session.principal_key)
        for name, response in opened:
            if response is None:
                continue
            if name not in merged.members:  # it left while the streams opened
                await response.aclose()
                continue
            merged.add(name, response, partial(self.requests.view, route.name, name, sealed_to))
        return merged

    def stopped(self, merged: Merged) -> None:
        """A merged stream that ended: no more followed."""
        self._listening.pop(merged, None)

    def members_changed(self, endpoints: Mapping[str, VirtualRoute]) -> None:
        """The registry changed the endpoints or the servers (/api/v1, a reload, another
        gateway's write): each GET stream on an endpoint whose members served changed is
        told its lists changed, listens to the members that joined (each opened in the
        stream's own task) and stops listening to those that left (their streams closed).
        Cheap: nothing to do without a GET stream open."""
        for merged, (session, principal) in list(self._listening.items()):
            now = endpoints.get(merged.endpoint)
            members = self.members.present(now.members if now is not None else ())
            if members == merged.members:
                continue
            before, merged.members = merged.members, members
            for name in before:
                if name not in members:
                    merged.drop(name)
            if now is not None:
                for name in members:
                    if name not in before:
                        merged.join(name, partial(self._joined, now, name, session, principal))
            merged.announce()

    async def _joined(self, route: VirtualRoute, name: str, session: Session,
                      principal: Principal) -> tuple[UpstreamAnswer, Outgoing] | None:
        """The GET stream of a member that joined while a client listens, and its view."""
        _, response = await self._member_stream(route, name, session, principal)
        if response is None:
            return None
        return response, partial(self.requests.view, route.name, name,
                                 bound(session, session.principal_key))

    async def _member_stream(self, route: VirtualRoute, name: str, session: Session,
                             principal: Principal) -> tuple[str, UpstreamAnswer | None]:
        try:
            member = await self.members.route(route, name, session)
            if member.era != "legacy":
                return name, None
            response = await self.forward.listen_held(member, principal, session.principal_key)
            if response is None:  # stateless: no stream to listen on
                return name, None
        except GatewayError as exc:
            log.info("/mcp/%s: no GET stream from member %s: %s", route.name, name, exc)
            return name, None
        if response.status_code >= 300 or not response.headers.get(
                "content-type", "").startswith("text/event-stream"):
            log.info("/mcp/%s: member %s offers no GET stream (HTTP %d)", route.name, name,
                     response.status_code)
            await response.aclose()
            return name, None
        return name, response
