"""A rate-limited call on the wire: 429, Retry-After, seed 000's body, audited, never forwarded."""

from __future__ import annotations

from tests.conftest import make_config, mock_upstream, running_gateway

CALL = {"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "t"}}


async def test_limited_call_is_429_with_retry_after_and_never_forwarded() -> None:
    up = mock_upstream()
    cfg = make_config(rate_limits=[{"name": "calls-per-user", "rate": "2/h"}])
    async with running_gateway(cfg, up.transport) as gw:
        assert [(await gw.post(CALL)).status_code for _ in range(2)] == [200, 200]
        limited = await gw.post(CALL)
        assert limited.status_code == 429
        assert limited.headers["retry-after"] == "1800"
        assert limited.json() == {"jsonrpc": "2.0", "id": 3, "error": {
            "code": -32000, "message": "Too many requests"}}
        # protocol chatter is not limited by a tools/call rule
        ping = await gw.post({"jsonrpc": "2.0", "id": 4, "method": "ping"})
        assert ping.status_code == 200
        assert len(up.seen) == 3
        records = await gw.audit.wait_for(4)
        assert (records[2].status, records[2].denied_reason) == (
            "denied", "rate_limit: calls-per-user")
