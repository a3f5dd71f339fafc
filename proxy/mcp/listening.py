"""The GET streams a gateway has open (`Listening`): each one's relay, and their clean end at a
drain.

A GET asks for the server-to-client stream (the guards, the caller and the audit record are
the gateway's, `Gateway._bodyless`). The route's forwarding opens it upstream
(`Forwarding.listen`: a `Listened` stream, or `NoStream`, 405 with `Allow`); it is relayed as
it comes (`StreamRelay`) or, when the client resumes a call's stream on a session whose
upstream keeps event ids, by a `ResumedRelay`, which holds an answer replayed on it to its
call's rules (proxy/mcp/resume.py); a stream relayed as it comes has the status notifications
of the caller's tasks read by `Tasks.listener` (each by its tool's result rules; another
task's left out). On SIGTERM each open stream is ended cleanly (`end_all`),
so its client reconnects to another replica.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from functools import partial
from typing import Any

from proxy.auth.principal import Principal
from proxy.chain import Chain
from proxy.mcp.call import SSE_HEADERS
from proxy.mcp.exchange import EdgeRequest, EdgeResponse, Exchange
from proxy.mcp.forwarding import NoStream, Routed
from proxy.mcp.relay import StreamRelay, Views
from proxy.mcp.resume import ResumedRelay, Resumption
from proxy.mcp.tasks import Tasks
from proxy.state import Session


class Listening:
    """The GET streams open now, each relayed until it ends; `draining` says whether the
    gateway has begun to drain (a stream opened meanwhile ends at once, cleanly)."""

    __slots__ = ("_draining", "_max", "_open", "_resumption", "_spawn")

    def __init__(self, *, spawn: Callable[[Coroutine[Any, Any, None]], None],
                 resumption: Resumption | None, max_response_bytes: int,
                 draining: Callable[[], bool]) -> None:
        self._spawn = spawn
        self._resumption = resumption  # None: no shared store keeps a call's context
        self._max = max_response_bytes  # an event of a resumed stream, held whole, at most
        self._draining = draining
        self._open: set[StreamRelay] = set()

    async def open(self, routed: Routed, req: EdgeRequest, session: Session | None,
                   exchange: Exchange, principal: Principal, chain: Chain,
                   tasks: Tasks | None = None) -> EdgeResponse:
        """The stream, relayed; or why the upstream has none (405). `chain`: the rules a
        resumed call's answer is held to; `tasks`: what reads the status notifications of
        the caller's tasks (proxy/mcp/tasks.py)."""
        listened = await routed.forwarding.listen(routed.route, req.headers, session,
                                                  principal, self._draining())
        if isinstance(listened, NoStream):
            exchange.noted(listened.note)
            return EdgeResponse(405, listened.allow)
        stopped = listened.stopped

        async def done(relay: StreamRelay) -> None:
            self._open.discard(relay)
            if stopped is not None:
                stopped()

        if listened.resumable and session is not None and self._resumption is not None:
            relay: StreamRelay = ResumedRelay(  # a call's stream, resumed: its answer settled
                listened.chunks, listened.close, spawn=self._spawn, on_done=done,
                limit=self._max,
                settle=partial(self._resumption.settle, chain, routed.name, session, principal),
                hold_notices=chain.notices(routed.name))
        else:
            notice = None if tasks is None else await tasks.listener(
                routed.name, principal, chain,
                partial(routed.forwarding.usable_tasks, routed.route, chain))
            relay = StreamRelay(listened.chunks, listened.close, views=Views(notice=notice),
                                spawn=self._spawn, on_done=done)
        self._open.add(relay)
        if self._draining():  # began to drain while the upstream answered
            relay.end()
        headers = {"Mcp-Session-Id": session.id} if session is not None else {}
        return EdgeResponse(200, {**SSE_HEADERS, **headers}, stream=relay)

    def end_all(self) -> None:
        """End each open stream cleanly (a drain): its client sees it end after its last
        whole event, and reconnects elsewhere."""
        for relay in list(self._open):
            relay.end()
