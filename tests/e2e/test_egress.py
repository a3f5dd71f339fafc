"""Egress on the wire, in both eras: a destination the upstream may not be dialled in, and data
a caller's zone may not receive. Each denial's exact answer, its audit record, and an upstream
that never sees the call."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from proxy.audit import query
from tests.e2e.conftest import open_stack
from tests.e2e.test_eras import modern_request
from tests.e2e.upstreams import UpstreamProbe, stateless_json_app

EGRESS = {"server": {"trusted_proxies": ["127.0.0.1"]},
          "egress": {"collections": {"customers": "local_only", "catalog": "remote"}}}


@asynccontextmanager
async def stack(tmp_path: Path, **upstream: Any) -> AsyncIterator[tuple[str, UpstreamProbe, str]]:
    async with open_stack(tmp_path, stateless_json_app, config=EGRESS, **upstream) as s:
        yield s.endpoint, s.probe, s.db_path


def call(era: str, **headers: str) -> tuple[bytes, dict[str, str]]:
    params = {"name": "echo", "arguments": {"text": "x"}}
    if era == "modern":
        body, h = modern_request("tools/call", params)
    else:
        body = orjson.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params})
        h = {"content-type": "application/json",
             "accept": "application/json, text/event-stream"}
    return body, {**h, **headers}


@pytest.mark.parametrize("era", ["legacy", "modern"])
async def test_a_destination_outside_the_upstreams_zones_is_never_dialled(
        tmp_path: Path, era: str) -> None:
    async with stack(tmp_path, zones=["remote"]) as (endpoint, probe, db):
        async with httpx.AsyncClient() as client:
            response = await client.post(endpoint, content=call(era)[0], headers=call(era)[1])
        assert response.status_code == 200
        assert response.json()["error"] == {
            "code": -32000, "message": "upstream not reachable under the egress policy"}
        assert "127.0.0.1" not in response.text
        assert probe.exchanges == []
    (record,) = [r for r in query(db) if r["method"] == "tools/call"]
    assert (record["status"], record["error_message"], record["era"]) == (
        "error", "egress_destination_denied", era)


@pytest.mark.parametrize("era", ["legacy", "modern"])
async def test_local_only_data_is_refused_to_a_lan_caller(tmp_path: Path, era: str) -> None:
    async with stack(tmp_path, collections=["customers"]) as (endpoint, probe, db):
        async with httpx.AsyncClient() as client:
            # the peer (127.0.0.1) is a trusted proxy: the caller is the LAN address it names
            body, headers = call(era, **{"x-forwarded-for": "10.1.2.3"})
            denied = await client.post(endpoint, content=body, headers=headers)
            local_body, local_headers = call(era)
            allowed = await client.post(endpoint, content=local_body, headers=local_headers)
        assert denied.status_code == 403
        error = denied.json()["error"]
        assert (error["code"], error["message"]) == (
            -32003, "Operation blocked by collection egress policy")
        data = error["data"]
        assert (data["code"], data["reason"]) == ("EGRESS_DENIED", "POLICY_LOCAL_ONLY")
        assert data["audit"]["destinationZone"] == "lan"
        assert data["audit"]["collections"] == ["customers"]
        assert data["audit"]["effectivePolicy"] == "local_only"
        assert allowed.status_code == 200  # the same data to a caller on this host
        assert len(probe.tool_calls("echo")) == 1
    denied_record = next(r for r in query(db) if r["status"] == "denied")
    assert denied_record["denied_reason"] == "egress: POLICY_LOCAL_ONLY collection customers"
    assert orjson.loads(denied_record["egress"]) == data["audit"]


async def test_x_forwarded_for_from_an_untrusted_peer_is_ignored(tmp_path: Path) -> None:
    async with stack(tmp_path, collections=["customers"]) as (endpoint, probe, _db):
        transport = httpx.AsyncHTTPTransport(local_address="127.0.0.2")  # not a trusted proxy
        async with httpx.AsyncClient(transport=transport) as client:
            body, headers = call("legacy", **{"x-forwarded-for": "203.0.113.9"})
            response = await client.post(endpoint, content=body, headers=headers)
        assert response.status_code == 200  # the peer, on this host, is the caller
        assert len(probe.tool_calls("echo")) == 1
