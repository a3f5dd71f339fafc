"""Guard parity: size cap, Origin, identity, access, rate limit and audit run in one place before
the era branch, so each guard gives the same decision to a legacy and a 2026-07-28 request."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import jwt
import orjson
import pytest

from proxy.app import create_app
from proxy.audit import query
from proxy.config import from_dict
from tests import db_backends
from tests.e2e.test_eras import modern_request
from tests.e2e.upstreams import stateless_json_app
from tests.servers import serve

SECRET = "parity-secret-of-at-least-thirty-two-bytes"


def token() -> str:
    return jwt.encode({"iss": "https://idp.test/", "aud": "http://127.0.0.1:8080/mcp/up",
                       "sub": "alice", "exp": int(time.time()) + 300}, SECRET, algorithm="HS256")


def request(era: str, tool: str = "echo", pad: int = 0, **headers: str
            ) -> tuple[bytes, dict[str, str]]:
    params = {"name": tool, "arguments": {"text": "x" * pad}}
    if era == "modern":
        body, h = modern_request("tools/call", params)
    else:
        body = orjson.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params})
        h = {"content-type": "application/json",
             "accept": "application/json, text/event-stream",
             "mcp-protocol-version": "2025-11-25"}
    h["authorization"] = f"Bearer {token()}"
    h.update({k.replace("_", "-"): v for k, v in headers.items()})
    return body, {k: v for k, v in h.items() if v != "-"}


GUARDS: dict[str, tuple[dict[str, Any], int, int | str]] = {
    "size cap": ({"pad": 5000}, 413, -32600),
    "origin": ({"origin": "https://evil.example"}, 403, -32600),
    "identity": ({"authorization": "-"}, 401, -32000),
    "access": ({"tool": "boom"}, 400, -32602),
    "allowed": ({}, 200, "ok"),
}


@pytest.mark.parametrize("era", ["legacy", "modern"])
@pytest.mark.parametrize("guard", list(GUARDS))
async def test_each_guard_decides_the_same_in_both_eras(tmp_path: Path, guard: str,
                                                         era: str) -> None:
    kwargs, status, code = GUARDS[guard]
    app, probe = stateless_json_app()
    db = db_backends.url()
    async with serve(app, graceful_timeout=1) as upstream_url:
        cfg = from_dict({
            "server": {"max_request_bytes": 4096},
            "database": {"url": db},
            "auth": {"mode": "jwt", "issuers": [{"issuer": "https://idp.test/",
                                                  "hs256_secret": SECRET,
                                                  "algorithms": ["HS256"]}]},
            "rate_limits": [{"name": "per-user", "rate": "1/h"}],
            "upstreams": [{"name": "up", "url": f"{upstream_url}/mcp",
                           "access": {"tools_deny": ["boom"]}}]}, env={})
        async with serve(create_app(cfg), graceful_timeout=1) as url, \
                httpx.AsyncClient() as client:
            body, headers = request(era, **kwargs)
            response = await client.post(f"{url}/mcp/up", content=body, headers=headers)
            assert response.status_code == status, response.text
            if code == "ok":
                assert response.json()["result"]["content"][0]["text"] == ""
                # the rate limit is the same guard for both: the second call is refused
                again = await client.post(f"{url}/mcp/up", content=body, headers=headers)
                assert again.status_code == 429 and again.json()["error"]["code"] == -32000
            else:
                assert response.json()["error"]["code"] == code
                assert probe.tool_calls("boom") == [] and probe.tool_calls("echo") == []
    records = query(db)
    assert records and all(r["era"] == era for r in records)
    if code != "ok":
        assert records[0]["status"] == "denied"
