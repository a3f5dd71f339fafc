"""One message asked of a virtual endpoint's members at once (a list, discover): each
member's result with that member's own access and egress decisions and its result rewriters
applied, through the plain `Forwarder`; whatever has not answered within the endpoint's
`list_timeout_s`, or failed, is left out (logged) and asked again on the next request.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Any

import orjson

from proxy.chain import CallContext, Chain, Rewrite
from proxy.errors import GatewayError, UpstreamFailure, UpstreamProtocolError
from proxy.jsonrpc import McpMessage
from proxy.mcp.forward import Forwarded, Forwarder, result_from_stream
from proxy.mcp.legs import Leg, after
from proxy.state import Session
from proxy.virtual.members import Members, context, outbound
from proxy.virtual.route import VirtualRoute

log = logging.getLogger("tollhouse.virtual")

PER_MEMBER = ("access", "egress")  # what a list asks of each member it reaches


class FanOut:
    """Asks every member at once; a member's answer is held whole to be merged, at most
    `max_response_bytes` (server.max_response_bytes)."""

    def __init__(self, forward: Forwarder, members: Members, max_response_bytes: int) -> None:
        self.forward = forward
        self.members = members
        self.max_response_bytes = max_response_bytes
        self._stragglers: set[asyncio.Task[Any]] = set()

    async def ask(self, route: VirtualRoute, members: Mapping[str, McpMessage],
                  ctx: CallContext, chain: Chain, session: Session | None,
                  seen: Callable[[str], Rewrite] | None = None) -> dict[str, dict[str, Any]]:
        """Every member asked at once; what has not answered within list_timeout_s, or
        failed, is left out (logged), and asked again on the next request."""
        tasks = {name: asyncio.ensure_future(self._one(
                     route, name, m, ctx, chain, session,
                     seen=None if seen is None else seen(name)))
                 for name, m in members.items()}
        if not tasks:
            return {}
        _, pending = await asyncio.wait(tasks.values(), timeout=route.list_timeout_s)
        out: dict[str, dict[str, Any]] = {}
        for name, task in tasks.items():
            if task in pending:
                task.cancel()
                self._stragglers.add(task)
                task.add_done_callback(self._stragglers.discard)
                log.warning("/mcp/%s: member %s did not answer %s within %.1f s: left out",
                            route.name, name, members[name].method, route.list_timeout_s)
                continue
            exc = task.exception()
            if exc is None:
                out[name] = task.result()
            elif isinstance(exc, GatewayError):
                log.warning("/mcp/%s: member %s left out of %s: %s", route.name, name,
                            members[name].method, exc)
            else:
                log.error("/mcp/%s: member %s failed on %s", route.name, name,
                          members[name].method, exc_info=exc)
        return out

    async def _one(self, route: VirtualRoute, member_name: str, msg: McpMessage,
                   ctx: CallContext, chain: Chain, session: Session | None,
                   seen: Rewrite | None = None) -> dict[str, Any]:
        """One member's result for a message the gateway fans out (a list, discover), with the
        member's own access and egress decisions and its result rewriters applied (`seen`
        reads it before they do)."""
        member = await self.members.route(route, member_name, session)
        mctx = context(ctx, member)
        await chain.run(msg, mctx, only=PER_MEMBER)
        mheaders, mmsg = outbound(msg, None, session)
        into = Forwarded(Leg([]))
        await self.forward.call(member, mheaders, mmsg, None, context(ctx, member, leg=True),
                                into)
        rewrite = into.leg.rewrite(after(seen, chain.rewriter(mmsg, mctx)), mmsg.method)
        if into.response is None:
            result = into.leg.local or {}
            if into.leg.initialized is not None:  # a legacy member's: its tasks capability too
                result = offering_tasks(result, into.leg.initialized)
            if rewrite is not None:
                rewrite(result)
            return result
        try:
            if into.response.headers.get("content-type", "").startswith("text/event-stream"):
                result = await result_from_stream(into.response, mmsg.id,
                                                  self.max_response_bytes)
                if rewrite is not None:
                    rewrite(result)
                return result
            data, _ = await self.forward.json_body(into, held=True,
                                                   limit=self.max_response_bytes, head=0)
            data, error = self.forward.json_answer(member, mmsg, into, rewrite, data)
        finally:
            await into.response.aclose()
        if error is not None:
            raise UpstreamFailure(f"member {member_name}: {error[:200]}")
        obj = orjson.loads(data)
        result = obj.get("result")
        if not isinstance(result, dict):
            raise UpstreamProtocolError()
        return result


def offering_tasks(discover: dict[str, Any], initialized: dict[str, Any]) -> dict[str, Any]:
    """A legacy member's discover (built from its initialize, which keeps only what the
    2026-07-28 era knows) with the 2025-11-25 `tasks` capability its initialize declared, for
    the endpoint's own initialize to advertise (proxy/virtual/tasks.py)."""
    offered = (initialized.get("capabilities") or {}).get("tasks")
    if not isinstance(offered, dict):
        return discover
    return {**discover, "capabilities": {**(discover.get("capabilities") or {}),
                                         "tasks": offered}}
