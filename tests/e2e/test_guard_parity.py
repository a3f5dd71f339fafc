"""Guard parity: size cap, Origin, identity, access, rate limit and audit run in one place before
the era branch, so each guard gives the same decision to a legacy and a 2026-07-28 request."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from proxy.audit import query
from tests.e2e.conftest import open_stack
from tests.e2e.test_eras import modern_request
from tests.e2e.upstreams import stateless_json_app
from tests.helpers import jwt_auth, token


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
    h["authorization"] = f"Bearer {token(endpoint='up')}"
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
    config = {"server": {"max_request_bytes": 4096}, "auth": jwt_auth(),
              "rate_limits": [{"name": "per-user", "rate": "1/h"}]}
    async with open_stack(tmp_path, stateless_json_app, config=config,
                          access={"tools_deny": ["boom"]}) as stack, \
            httpx.AsyncClient() as client:
        body, headers = request(era, **kwargs)
        response = await client.post(stack.endpoint, content=body, headers=headers)
        assert response.status_code == status, response.text
        if code == "ok":
            assert response.json()["result"]["content"][0]["text"] == ""
            # the rate limit is the same guard for both: the second call is refused
            again = await client.post(stack.endpoint, content=body, headers=headers)
            assert again.status_code == 429 and again.json()["error"]["code"] == -32000
        else:
            assert response.json()["error"]["code"] == code
            assert stack.probe.tool_calls("boom") == [] and stack.probe.tool_calls("echo") == []
    records = query(stack.db_path)
    assert records and all(r["era"] == era for r in records)
    if code != "ok":
        assert records[0]["status"] == "denied"
