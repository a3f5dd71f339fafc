"""The /api/v1 routes the web console added: a person's own keys (/me/keys), the aggregates
its charts read (/usage/series, /usage/summary), one audit record and the audit export; and
one audit record for every change made through /api/v1."""

from __future__ import annotations

import csv
import io
import time
from pathlib import Path
from typing import Any

import orjson

from proxy.audit import DatabaseAuditSink
from proxy.audit.record import AuditRecord
from tests.api.test_api import env, signed_in
from tests.helpers import until


async def _seed(db: str) -> float:
    sink = DatabaseAuditSink(db)
    now = time.time()
    for i, (status, ms) in enumerate([("ok", 3.0)] * 18 + [("error", 700.0), ("denied", 1.0)]):
        sink.emit(AuditRecord(endpoint="cfgd", method="tools/call", principal=f"p{i % 2}",
                              tool="echo" if i % 3 else "add", status=status, duration_ms=ms,
                              denied_reason="access: nope" if status == "denied" else None,
                              ts=now - 30 - i))
    await sink.close()
    return now


async def test_person_keys_are_their_own(tmp_path: Path) -> None:
    async with env(tmp_path) as e:
        pat = await signed_in(e, "pat", "pat-password")
        origin = {"Origin": e.url}
        listed = (await pat.get(e.api("/me/keys"))).json()
        assert listed == {"items": [], "endpoints": ["cfgd"]}
        made = await pat.post(e.api("/me/keys"), json={"name": "laptop", "endpoints": ["cfgd"]},
                              headers=origin)
        assert made.status_code == 201, made.text
        key = made.json()
        assert key["name"] == "laptop" and key["key"].startswith("th_") and key["role"] == ""
        # not an admin key, not an endpoint the person may not use, not without an endpoint
        for body in ({"name": "x", "endpoints": ["cfgd"], "role": "admin"},
                     {"name": "x", "endpoints": ["nope"]}, {"name": "x", "endpoints": []}):
            refused = await pat.post(e.api("/me/keys"), json=body, headers=origin)
            assert refused.status_code == 422, body
        # left out, as empty: a key valid on every endpoint, those made later too (#36 item 9)
        for body, problem in (({"name": "x"}, {"loc": ["body", "endpoints"],
                                               "msg": "Field required", "type": "missing"}),
                              ({"name": "x", "endpoints": []},
                               {"loc": ["body", "endpoints"], "msg": "name at least one "
                                "endpoint", "type": "value_error"})):
            refused = await pat.post(e.api("/me/keys"), json=body, headers=origin)
            assert (refused.status_code, refused.json()) == (422, {"detail": [problem]}), body
        assert [k["name"] for k in (await pat.get(e.api("/me/keys"))).json()["items"]] == \
            ["laptop"]
        doc = (await e.admin.get(e.api("/openapi.json"))).json()
        asked = doc["paths"]["/api/v1/me/keys"]["post"]["requestBody"]["content"][
            "application/json"]["schema"]
        schema = doc["components"]["schemas"][asked["$ref"].rsplit("/", 1)[1]]
        assert "endpoints" in schema["required"]
        assert schema["properties"]["endpoints"]["minItems"] == 1
        # the key works on the MCP edge of its endpoint
        init = await pat.post(f"{e.url}/mcp/cfgd", headers={
            "Authorization": f"Bearer {key['key']}", "Accept": "application/json, "
            "text/event-stream", "Content-Type": "application/json"}, content=orjson.dumps(
            {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                "protocolVersion": "2025-11-25", "capabilities": {},
                "clientInfo": {"name": "t", "version": "1"}}}))
        assert init.status_code == 200, init.text
        # another person sees none of it and cannot revoke it
        root = await signed_in(e, "root", "root-password")
        assert (await root.get(e.api("/me/keys"))).json()["items"] == []
        other = await root.delete(e.api(f"/me/keys/{key['id']}"), headers={"Origin": e.url})
        assert other.status_code == 404
        # an API-key script has no "me"
        assert (await e.admin.get(e.api("/me/keys"))).status_code == 403
        mine = (await pat.get(e.api("/me/keys"))).json()["items"]
        assert [k["id"] for k in mine] == [key["id"]] and mine[0]["name"] == "laptop"
        gone = await pat.delete(e.api(f"/me/keys/{key['id']}"), headers=origin)
        assert gone.status_code == 204
        assert (await pat.get(e.api("/me/keys"))).json()["items"][0]["status"] == "revoked"
        for c in (pat, root):
            await c.aclose()


async def test_changes_are_audited_once(tmp_path: Path) -> None:
    async with env(tmp_path) as e:
        made = await e.admin.post(e.api("/servers"), json={
            "name": "crm", "url": f"{e.upstream}/mcp", "zones": ["loopback"]})
        assert made.status_code == 201
        patched = await e.admin.patch(e.api("/servers/crm"), json={"timeout_s": 5})
        assert patched.status_code == 200
        bad = await e.admin.patch(e.api("/servers/nope"), json={"timeout_s": 5})
        assert bad.status_code == 404
        pat = await signed_in(e, "pat", "pat-password")
        try:
            denied = await pat.delete(e.api("/servers/crm"), headers={"Origin": e.url})
        finally:
            await pat.aclose()
        assert denied.status_code == 403

        # each record is durable before its change is answered; with the audit journal
        # (SQLite) it is in the database, where /api/v1/audit reads, a commit later
        rows: list[dict[str, Any]] = []

        async def four() -> bool:
            nonlocal rows
            rows = [r for r in (await e.admin.get(e.api("/audit"), params={
                "endpoint": "/api/v1"})).json()["items"] if r["method"] != "audit/read"]
            return len(rows) >= 4

        await until(four, what="the four change records")
        assert [(r["method"], r["status"], r["note"]) for r in rows] == [
            ("DELETE /api/v1/servers/crm", "denied", "HTTP 403"),
            ("PATCH /api/v1/servers/nope", "error", "HTTP 404"),
            ("PATCH /api/v1/servers/crm", "ok", "HTTP 200"),
            ("POST /api/v1/servers", "ok", "HTTP 201")]
        key_id = e.admin_key.split("_")[1]
        assert rows[2]["principal"] == f"tollhouse:api-key|key:{key_id}"
        assert rows[0]["principal"].startswith("tollhouse:local|")  # the person, by subject
        mine = await e.admin.get(e.api("/audit"), params={
            "endpoint": "/api/v1", "principal": rows[2]["principal"]})
        # the three changes, and the reads of the audit log above (each a record of its own)
        assert [r["method"] for r in mine.json()["items"]
                if r["method"] != "audit/read"] == [r["method"] for r in rows[1:]]
        assert e.admin_key not in orjson.dumps(rows).decode()  # no secret in the audit


async def test_series_summary_record_and_export(tmp_path: Path) -> None:
    async with env(tmp_path) as e:
        now = await _seed(e.db)
        role = await e.admin.post(e.api("/roles"), json={"name": "ops"})  # audited, not MCP
        assert role.status_code == 201
        series = await e.admin.get(e.api("/usage/series"), params={
            "since": f"{now - 60:.3f}", "until": f"{now:.3f}", "bucket_s": "30"})
        assert series.status_code == 200
        items = series.json()["items"]
        assert len(items) == 2 and sum(b["ok"] for b in items) == 18
        assert sum(b["error"] + b["denied"] for b in items) == 2
        summary = (await e.admin.get(e.api("/usage/summary"))).json()
        (cfgd,) = summary["endpoints"]  # the management API's own records are not traffic
        assert cfgd["calls"] == 20 and cfgd["error"] == 1 and cfgd["error_rate"] == 0.05
        assert cfgd["p95_ms"] == 5.0  # 19 of 20 under 5 ms: the 95th is in that bucket
        assert summary["denials"] == [{"policy": "access", "reason": "access: nope",
                                       "calls": 1}]
        assert summary["tools"][0] == {"endpoint": "cfgd", "tool": "echo", "calls": 13}
        assert summary["outbox_backlog"] == 0
        for params in ({"bucket_s": "0"}, {"bucket_s": "x"}, {"since": "1", "until": "1e9"},
                       {"since": "0", "bucket_s": "1"}):
            assert (await e.admin.get(e.api("/usage/series"), params=params)).status_code == 422
        page = (await e.admin.get(e.api("/audit"), params={"status": "error"})).json()
        one = await e.admin.get(e.api(f"/audit/{page['items'][0]['id']}"))
        assert one.status_code == 200 and one.json()["status"] == "error"
        assert (await e.admin.get(e.api("/audit/999999999"))).status_code == 404
        assert (await e.admin.get(e.api("/audit/abc"))).status_code == 404
        exported = await e.admin.get(e.api("/audit/export"), params={"tool": "add"})
        assert exported.status_code == 200 and exported.headers["content-type"].startswith(
            "text/csv")
        rows = list(csv.DictReader(io.StringIO(exported.text)))
        assert len(rows) == 7 and {r["tool"] for r in rows} == {"add"}
        lines = await e.admin.get(e.api("/audit/export"), params={"format": "jsonl",
                                                                  "status": "denied"})
        assert [orjson.loads(x)["status"] for x in lines.text.splitlines()] == ["denied"]
        assert (await e.admin.get(e.api("/audit/export"),
                                  params={"format": "xml"})).status_code == 422
        pat = await signed_in(e, "pat", "pat-password")
        assert (await pat.get(e.api("/audit/export"))).status_code == 403
        assert (await pat.get(e.api("/usage/summary"))).status_code == 403
        await pat.aclose()
