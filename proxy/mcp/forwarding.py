"""What the spine asks of an upstream kind: one `Forwarding` per kind, chosen once per route.

A plain upstream (a URL, a caller's own URL, a local stdio process: `proxy.mcp.forward`) and a
virtual endpoint (`proxy.virtual.spread`) are each an implementation; so is any new kind. The
gateway (`gateway.py`) looks a route up once (`Routed`: the route and its forwarding, as an
HTTP client picks a transport from its mounts once per URL) and from then on only calls the
methods below, never asking which kind it holds:

    check        the policy chain for a message, once per target (a virtual endpoint's member
                 and its name; a plain upstream's own); the context the call goes on with
    call         forward a request; `into` holds the leg (and the upstream's 2xx answer, or a
                 result answered here in `leg.local`)
    views        what the relay of a streamed answer does with the upstream's own requests
                 and notifications (refuse them, or view each: a member named, an id sealed)
    json_answer  a whole JSON answer, rewritten for the client
    one_way      a notification or a client's answer to a server request
    notify_cancelled  tell the upstream a call is over (the deadline, a disconnect)
    listen       the GET stream (`Listened`), or `NoStream` (405) when there is none; one
                 that would open a stream while the gateway drains raises `Draining`
    end          DELETE: end the session upstream too

`relays_client_cancel`: a client's own notifications/cancelled reaches the upstream by
`one_way` (so the spine need not send another); `resumable(leg)`: the upstream's stream of a
call on that leg may be resumed by the client (proxy/mcp/resume.py).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from proxy.auth.principal import Principal
    from proxy.chain import CallContext, Chain, Rewrite
    from proxy.config.template import UrlTemplate
    from proxy.jsonrpc import McpMessage
    from proxy.mcp.forward import Forwarded
    from proxy.mcp.legs import Leg
    from proxy.state import Session


class Route(Protocol):
    """What the spine reads of any route."""

    @property
    def name(self) -> str: ...

    @property
    def url_text(self) -> str: ...

    @property
    def total_timeout_s(self) -> float: ...

    @property
    def dial_key(self) -> str: ...

    @property
    def session_endpoint(self) -> str: ...

    @property
    def template(self) -> UrlTemplate | None: ...


@dataclass(slots=True)
class Listened:
    """A GET stream, open: its chunks, how to close it, and what to do once it has ended."""

    chunks: AsyncIterator[bytes]
    close: Callable[[], Awaitable[None]]
    stopped: Callable[[], None] | None = None
    resumable: bool = False  # a call's stream, resumed (`Last-Event-ID`): its answer settled


@dataclass(frozen=True, slots=True)
class NoStream:
    """No GET stream here: answered 405 with `allow`, and why (the audit record's note)."""

    allow: dict[str, str]
    note: str


# a relay's view of an upstream request or notification on a call's stream (True: changed)
Outgoing = Callable[[dict[str, Any]], bool]


class Forwarding(Protocol):
    relays_client_cancel: bool

    async def check(self, route: Any, chain: Chain, msg: McpMessage, ctx: CallContext
                    ) -> CallContext: ...

    async def usable_tasks(self, route: Any, chain: Chain, ctx: CallContext) -> None:
        """`ctx.task.owned` kept to the tasks whose tool the caller may still use (as its
        tasks/list keeps them): what a GET stream relays the status notifications of."""

    async def call(self, route: Any, headers: Mapping[str, str], msg: McpMessage,
                   session: Session | None, ctx: CallContext, into: Forwarded,
                   chain: Chain) -> None: ...

    def views(self, route: Any, leg: Leg, session: Session | None, ctx: CallContext
              ) -> tuple[bool, Outgoing | None]: ...

    def resumable(self, leg: Leg) -> bool: ...

    def json_answer(self, route: Any, msg: McpMessage, forwarded: Forwarded,
                    rewrite: Rewrite | None, data: bytes) -> tuple[bytes, str | None]: ...

    async def one_way(self, route: Any, headers: Mapping[str, str], msg: McpMessage,
                      session: Session | None, ctx: CallContext) -> None: ...

    def notify_cancelled(self, route: Any, leg: Leg, request_id: Any, reason: str) -> None: ...

    async def listen(self, route: Any, headers: Mapping[str, str], session: Session | None,
                     principal: Principal, draining: bool) -> Listened | NoStream: ...

    async def end(self, route: Any, headers: Mapping[str, str], session: Session
                  ) -> dict[str, str] | None: ...


@dataclass(frozen=True, slots=True)
class Routed:
    """A route and the forwarding of its kind, looked up once per request."""

    route: Any  # a Route
    forwarding: Forwarding

    @property
    def name(self) -> str:
        return str(self.route.name)
