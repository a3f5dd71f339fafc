"""A new kind of upstream is a new `Forwarding` (proxy/mcp/forwarding.py), mounted on the real
gateway without a line of `gateway.py` changed: one that answers from memory serves the
official SDK client's `initialize`, `tools/list` and `tools/call` through Hypercorn, with the
policy chain (a rate limit, a result guardrail) and one audit record per call."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pytest
from mcp import MCPError

from proxy.auth.principal import Principal
from proxy.chain import CallContext, Chain, Rewrite
from proxy.config import from_dict
from proxy.jsonrpc import McpMessage
from proxy.mcp.forward import Forwarded
from proxy.mcp.forwarding import Listened, NoStream, Outgoing
from proxy.mcp.legs import Leg
from proxy.state import Session
from tests import db_backends, state_backends
from tests.conftest import running_gateway
from tests.e2e.sdk_client import connect

SECRET = "AKIAIOSFODNN7EXAMPLE"


@dataclass(frozen=True)
class MemoryRoute:
    name: str
    url_text: str = "memory:"
    total_timeout_s: float = 30.0
    template: None = None

    @property
    def dial_key(self) -> str:
        return self.name

    @property
    def session_endpoint(self) -> str:
        return self.name


class MemoryForwarding:
    """Tools answered from a dict; no stream, no session upstream, nothing to cancel."""

    relays_client_cancel = False

    def __init__(self) -> None:
        self.calls: list[str] = []

    async def check(self, route: MemoryRoute, chain: Chain, msg: McpMessage,
                    ctx: CallContext) -> CallContext:
        await chain.run(msg, ctx, without=("egress",))  # it dials nothing: no destination
        return ctx

    async def usable_tasks(self, route: MemoryRoute, chain: Chain, ctx: CallContext) -> None:
        return None  # it runs no task

    async def call(self, route: MemoryRoute, headers: Mapping[str, str], msg: McpMessage,
                   session: Session | None, ctx: CallContext, into: Forwarded,
                   chain: Chain) -> None:
        params = msg.params or {}
        local: dict[str, Any]
        if msg.method == "initialize":
            local = {"protocolVersion": params.get("protocolVersion"), "capabilities":
                     {"tools": {}}, "serverInfo": {"name": "memory", "version": "1"}}
        elif msg.method == "tools/list":
            local = {"tools": [{"name": "recall", "inputSchema": {"type": "object"}}]}
        elif msg.method == "tools/call":
            self.calls.append(str(params.get("name")))
            local = {"content": [{"type": "text", "text": f"remembered key={SECRET}"}]}
        else:
            local = {}
        into.leg = Leg([], local=local)

    def views(self, route: MemoryRoute, leg: Leg, session: Session | None,
              ctx: CallContext) -> tuple[bool, Outgoing | None]:
        return False, None

    def resumable(self, leg: Leg) -> bool:
        return False

    def json_answer(self, route: MemoryRoute, msg: McpMessage, forwarded: Forwarded,
                    rewrite: Rewrite | None, data: bytes) -> tuple[bytes, str | None]:
        raise AssertionError("answered from memory: no upstream body")

    async def one_way(self, route: MemoryRoute, headers: Mapping[str, str], msg: McpMessage,
                      session: Session | None, ctx: CallContext) -> None:
        return None

    def notify_cancelled(self, route: MemoryRoute, leg: Leg, request_id: Any,
                         reason: str) -> None:
        return None

    async def listen(self, route: MemoryRoute, headers: Mapping[str, str],
                     session: Session | None, principal: Principal, draining: bool
                     ) -> Listened | NoStream:
        return NoStream({"Allow": "POST, DELETE"}, "memory has no GET stream")

    async def end(self, route: MemoryRoute, headers: Mapping[str, str], session: Session
                  ) -> dict[str, str] | None:
        return None


async def test_a_new_kind_serves_through_the_spine_with_policies_and_audit() -> None:
    cfg = from_dict({
        "database": {"url": db_backends.url()}, "state": state_backends.state(),
        "upstreams": [{"name": "e", "url": "http://upstream.test/mcp"}],
        "rate_limits": [{"name": "memory", "rate": "2/h"}],
        "guardrails": [{"name": "keys", "tools": ["recall"], "on": ["results"],
                        "detect": ["secrets"], "action": "redact"}]},
        env={})
    memory = MemoryForwarding()
    async with running_gateway(cfg) as gw:
        assert (await gw.client.get(f"{gw.url}/healthz")).status_code == 200  # serving now
        gw.gateway.mount("mem", MemoryRoute("mem"), memory)
        async with connect(gw.endpoint("mem")) as client:
            assert [t.name for t in (await client.list_tools()).tools] == ["recall"]
            for _ in range(2):
                result = await client.call_tool("recall", {})
                assert result.content[0].text == "remembered key=[REDACTED:secret]"
            with pytest.raises(MCPError) as info:  # the rate limit's third call
                await client.call_tool("recall", {})
            assert info.value.error.code == -32000
    assert memory.calls == ["recall", "recall"]  # the refused call reached no upstream
    calls = [r for r in gw.audit.records if r.method == "tools/call"]
    assert [(r.endpoint, r.tool, r.status) for r in calls] == [
        ("mem", "recall", "ok"), ("mem", "recall", "ok"), ("mem", "recall", "denied")]
    assert calls[0].note == "guardrail keys: redact secret in result"
    assert all(SECRET not in repr(r) for r in gw.audit.records)
