"""Auth-failure lockouts at the MCP edge key on the caller's address: behind a trusted proxy,
the client address the proxy wrote in X-Forwarded-For; otherwise the socket peer, whatever
X-Forwarded-For a client sends."""

from __future__ import annotations

import orjson

from proxy.config import Config
from tests.conftest import MCP_HEADERS, RunningGateway, make_config, mock_upstream, running_gateway
from tests.helpers import jwt_auth, token

CALL = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "echo", "arguments": {"text": "hi"}}}
A, B = "203.0.113.5", "198.51.100.7"


def config(trusted_proxies: list[str]) -> Config:
    return make_config(
        server={"trusted_proxies": trusted_proxies},
        auth=jwt_auth(lockout={"max_failures": 2, "window_s": 60, "lockout_s": 120}))


async def call(gw: RunningGateway, bearer: str, forwarded_for: str, method: str = "POST"
               ) -> int:
    headers = {**MCP_HEADERS, "Authorization": f"Bearer {bearer}",
               "X-Forwarded-For": forwarded_for}
    response = await gw.client.request(method, gw.endpoint(), headers=headers,
                                       content=orjson.dumps(CALL) if method == "POST" else None)
    return response.status_code


async def test_behind_a_trusted_proxy_one_caller_cannot_lock_out_another() -> None:
    async with running_gateway(config(["127.0.0.1"]), mock_upstream().transport) as gw:
        bad = token("not-the-secret-0123456789abcdef0123456789")
        assert [await call(gw, bad, A) for _ in range(2)] == [401, 401]
        assert await call(gw, token(), A) == 429  # A is locked out, even with a good token
        assert await call(gw, token(), A, "GET") == 429
        assert await call(gw, token(), B) == 200  # B, behind the same proxy, is not
        assert await call(gw, token(), B, "GET") == 405
        # the proxy appends the address it heard: what a client wrote left of it proves nothing
        assert await call(gw, token(), f"{B}, {A}") == 429


async def test_without_trusted_proxies_x_forwarded_for_is_ignored() -> None:
    async with running_gateway(config([]), mock_upstream().transport) as gw:
        bad = token("not-the-secret-0123456789abcdef0123456789")
        assert [await call(gw, bad, A) for _ in range(2)] == [401, 401]
        assert await call(gw, token(), B) == 429  # one peer: a forged header changes nothing
