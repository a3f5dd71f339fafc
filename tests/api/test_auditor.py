"""The built-in role `auditor` (issue 39 item 3): a person holding it, or an API key of role
"auditor", reads the audit log, usage and policies through /api/v1 and the console, and is
refused every change (403, seed 004's shape): every write route of the app's URL map under
/api/v1 and /console, so that a route added later is covered without a change here. Every
read and export of audit records is an audit record of its own (who, which filter, how many
records), an administrator's as much as an auditor's; administrators and users are unchanged."""

from __future__ import annotations

import csv
import io
import re
from pathlib import Path
from typing import Any

import httpx
import orjson

from proxy.api.caller import READS_ONLY
from proxy.audit import AuditRecord, DatabaseAuditSink
from proxy.storage.db import Database
from tests.api.test_api import Env, detail, env, signed_in
from tests.conftest import MCP_HEADERS
from tests.helpers import until

READS = {"GET", "HEAD", "OPTIONS"}
# a path argument's stand-in: an int converter gets a number, any other a plain name
ARGUMENT = re.compile(r"<(?:(\w+)(?:\([^)]*\))?:)?(\w+)>")
SHOWN = {"name": "cfgd", "upstream": "gh", "server": "cfgd", "tool": "add",
         "key_id": "abcdefghij", "policy_id": "p1", "record_id": "1"}


def _concrete(rule: str) -> str:
    return ARGUMENT.sub(lambda m: "1" if m.group(1) == "int" else SHOWN.get(m.group(2), "x"),
                        rule)


def write_routes(e: Env) -> list[tuple[str, str, str]]:
    """(method, concrete path, endpoint) of every change the app serves under /api/v1 and
    /console, read from its URL map."""
    found = []
    for rule in e.app.url_map.iter_rules():
        if not (rule.rule.startswith("/api/v1/") or rule.rule.startswith("/console")):
            continue
        for method in sorted((rule.methods or set()) - READS):
            found.append((method, _concrete(rule.rule), rule.endpoint))
    return found


def _csrf(page: httpx.Response) -> str:
    match = re.search(r'name="csrf" value="([0-9a-f]{64})"', page.text)
    assert match, page.text[:300]
    return match.group(1)


async def _state(e: Env) -> dict[str, Any]:
    """What a change could touch, as an administrator reads it."""
    seen = {}
    for path in ("/servers", "/keys", "/users", "/roles", "/endpoints", "/policies", "/pins"):
        answer = await e.admin.get(e.api(path))
        assert answer.status_code == 200, (path, answer.text)
        seen[path] = answer.json()
    return seen


async def _auditors(e: Env) -> tuple[httpx.AsyncClient, httpx.AsyncClient, str]:
    """A person holding the role (signed in) and a key of the role, made through the API."""
    made = await e.admin.post(e.api("/users"), json={"name": "audrey", "password": "a" * 12,
                                                     "roles": ["auditor"]})
    assert made.status_code == 201, made.text
    assert made.json()["roles"] == ["auditor"] and made.json()["admin"] is False
    key = await e.admin.post(e.api("/keys"), json={"name": "siem-reader", "role": "auditor"})
    assert key.status_code == 201, key.text
    assert key.json()["role"] == "auditor" and key.json()["endpoints"] == []
    person = await signed_in(e, "audrey", "a" * 12)
    script = httpx.AsyncClient(headers={"Authorization": f"Bearer {key.json()['key']}"},
                               timeout=10)
    return person, script, key.json()["id"]


async def test_an_auditor_is_refused_every_write(tmp_path: Path) -> None:
    async with env(tmp_path, per_user=True) as e:
        person, script, key_id = await _auditors(e)
        writes = write_routes(e)
        endpoints = {endpoint for _, _, endpoint in writes}
        # the enumeration sees the API's, the console's and the connections' changes
        assert {"api_create_server", "api_delete_policy", "api_approve", "api_create_my_key",
                "api_disconnect", "console.create_server_post",
                "console.revoke_my_key_post"} <= endpoints, sorted(endpoints)
        assert len(writes) >= 40
        before = await _state(e)
        token = _csrf(await person.get(f"{e.url}/console/me/keys"))
        origin = {"Origin": e.url}
        for method, path, endpoint in writes:
            if path.startswith("/console"):
                answer = await person.request(method, e.url + path, headers=origin,
                                              data={"csrf": token, "name": "x"})
                assert answer.status_code == 403, (method, path, answer.text[:300])
                assert "Auditors change nothing" in answer.text, (method, path)
                continue
            body = orjson.dumps({"name": "x"})
            for who in (person, script):
                answer = await who.request(method, e.url + path, content=body, headers={
                    **origin, "Content-Type": "application/json"})
                if who is script and endpoint == "api_disconnect":
                    # a browser session's route alone: a key is no one there
                    assert answer.status_code == 401, answer.text
                    continue
                assert answer.status_code == 403, (method, path, answer.text)
                assert detail(answer) == READS_ONLY, (method, path)
        assert await _state(e) == before  # nothing changed

        # each refusal is audited, its principal the auditor
        records = (await e.admin.get(e.api("/audit"), params={
            "endpoint": "/api/v1", "principal": f"tollhouse:api-key|key:{key_id}",
            "status": "denied", "limit": "500"})).json()["items"]
        api_writes = [w for w in writes if w[1].startswith("/api/v1/")
                      and w[2] != "api_disconnect"]
        assert sorted(r["method"] for r in records) == sorted(
            f"{m} {p}" for m, p, _ in api_writes)
        assert {r["denied_reason"] for r in records} == {"api: HTTP 403"}

        # a key of the role calls no MCP endpoint, and names none
        async with httpx.AsyncClient() as mcp:
            call = await mcp.post(f"{e.url}/mcp/cfgd", headers={
                **MCP_HEADERS, "Authorization": script.headers["Authorization"]},
                content=orjson.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}))
        assert call.status_code == 403 and call.json()["error"]["code"] == -32000
        narrow = await e.admin.post(e.api("/keys"), json={"name": "n", "role": "auditor",
                                                          "endpoints": ["cfgd"]})
        assert narrow.status_code == 422
        assert detail(narrow)[0]["loc"] == ["body", "endpoints"]
        edge = await e.admin.post(e.api("/keys"), json={"name": "e", "endpoints": ["cfgd"]})
        widened = await e.admin.patch(e.api(f"/keys/{edge.json()['id']}"),
                                      json={"role": "auditor"})
        assert widened.status_code == 422, widened.text
        for c in (person, script):
            await c.aclose()


async def test_an_auditor_reads_the_evidence_and_nothing_else(tmp_path: Path) -> None:
    async with env(tmp_path) as e:
        person, script, _ = await _auditors(e)
        me = (await person.get(e.api("/me"))).json()
        assert (me["auditor"], me["admin"]) == (True, False)
        assert (await script.get(e.api("/me"))).json()["auditor"] is True
        for who in (person, script):
            for path in ("/audit", "/audit/1", "/audit/export", "/usage", "/usage/series",
                         "/usage/summary", "/policies"):
                answer = await who.get(e.api(path))
                assert answer.status_code == 200, (path, answer.text)
            for path in ("/servers", "/keys", "/users", "/roles", "/sessions", "/pins",
                         "/endpoints", "/server-status?name=cfgd", "/servers/cfgd/status"):
                answer = await who.get(e.api(path))
                assert answer.status_code == 403 and detail(answer) == "administrators only"
        for path in ("/console/", "/console/audit", "/console/audit/1", "/console/usage",
                     "/console/policies", "/console/me/keys"):
            page = await person.get(e.url + path)
            assert page.status_code == 200, (path, page.text[:300])
        overview = await person.get(f"{e.url}/console/")
        assert "(auditor)" in overview.text and 'href="/console/audit"' in overview.text
        assert 'href="/console/servers"' not in overview.text
        refused = await person.get(f"{e.url}/console/servers")
        assert refused.status_code == 403 and "Administrators only" in refused.text
        for c in (person, script):
            await c.aclose()


async def test_every_read_of_audit_records_is_audited(tmp_path: Path) -> None:
    async with env(tmp_path) as e:
        person, script, key_id = await _auditors(e)
        reader = f"tollhouse:api-key|key:{key_id}"
        page = await script.get(e.api("/audit"), params={"endpoint": "/api/v1",
                                                         "limit": "2"})
        assert len(page.json()["items"]) == 2
        first = page.json()["items"][0]["id"]
        assert (await script.get(e.api(f"/audit/{first}"))).status_code == 200
        assert (await script.get(e.api("/audit/999999"))).status_code == 404
        export = await script.get(e.api("/audit/export"), params={
            "format": "csv", "endpoint": "/api/v1"})
        exported = list(csv.DictReader(io.StringIO(export.text)))
        assert exported
        lines = await script.get(e.api("/audit/export"), params={"format": "jsonl",
                                                                 "status": "denied"})
        assert lines.text == ""
        # the console's page reads through /api/v1: its reader is the person
        shown = await person.get(f"{e.url}/console/audit?status=ok")
        assert shown.status_code == 200
        rows = shown.text.count('class="st-ok"')
        assert rows > 0
        pat = await signed_in(e, "pat", "pat-password")
        assert (await pat.get(e.api("/audit"))).status_code == 403
        # an administrator's reads are audited as well
        admin_read = await e.admin.get(e.api("/audit"), params={"principal": reader,
                                                                "limit": "500"})
        mine = [(r["method"], r["status"], r["note"]) for r in admin_read.json()["items"]]
        assert mine[::-1] == [
            ("audit/read", "ok", "2 records; filter: endpoint=%2Fapi%2Fv1&limit=2"),
            ("audit/record", "ok", f"1 record; filter: id={first}"),
            ("audit/record", "error", "0 records; filter: id=999999"),
            ("audit/export", "ok",
             f"{len(exported)} records; filter: endpoint=%2Fapi%2Fv1&format=csv"),
            ("audit/export", "ok", "0 records; filter: status=denied&format=jsonl")]
        everyone = (await e.admin.get(e.api("/audit"), params={
            "endpoint": "/api/v1", "limit": "500"})).json()["items"]
        by_person = [r for r in everyone if r["principal"].startswith("tollhouse:local|")
                     and r["method"] in ("audit/read", "GET /api/v1/audit")]
        assert [(r["method"], r["status"], r["note"]) for r in by_person] == [
            ("GET /api/v1/audit", "denied", "HTTP 403"),  # pat, refused: named too
            ("audit/read", "ok", f"{rows} records; filter: status=ok&limit=50")]
        assert any(r["method"] == "audit/read" and r["principal"] == "tollhouse:api-key|key:"
                   + e.admin_key.split("_")[1] for r in everyone)
        for c in (person, script, pat):
            await c.aclose()


async def test_an_administrator_and_a_user_are_unchanged(tmp_path: Path) -> None:
    async with env(tmp_path) as e:
        made = await e.admin.post(e.api("/roles"), json={"name": "ops"})
        assert made.status_code == 201
        # an administrator who also holds the role still changes what they manage
        both = await e.admin.patch(e.api("/users/root"), json={"roles": ["auditor", "ops"]})
        assert both.status_code == 200 and both.json()["roles"] == ["auditor", "ops"]
        root = await signed_in(e, "root", "root-password")
        changed = await root.post(e.api("/roles"), json={"name": "sre"},
                                  headers={"Origin": e.url})
        assert changed.status_code == 201
        # a user: their own key, and no administrator's page or read of the audit log
        pat = await signed_in(e, "pat", "pat-password")
        assert (await pat.get(e.api("/me"))).json()["auditor"] is False
        own = await pat.post(e.api("/me/keys"), json={"name": "mine", "endpoints": ["cfgd"]},
                             headers={"Origin": e.url})
        assert own.status_code == 201, own.text
        for path in ("/servers", "/audit", "/usage", "/policies"):
            refused = await pat.get(e.api(path))
            assert refused.status_code == 403 and detail(refused) == "administrators only"
        # the role is given and taken like any other, and is no group of the user's
        given = await e.admin.put(e.api("/users/pat"), json={"name": "pat",
                                                             "roles": ["auditor"]})
        assert given.json()["roles"] == ["auditor"]
        assert (await pat.get(e.api("/audit"))).status_code == 200  # read afresh
        taken = await e.admin.patch(e.api("/users/pat"), json={"roles": []})
        assert taken.json()["roles"] == []
        assert (await pat.get(e.api("/audit"))).status_code == 403
        for c in (root, pat):
            await c.aclose()


async def test_a_custom_role_named_auditor_from_before_grants_nothing(tmp_path: Path) -> None:
    async with env(tmp_path) as e:
        database = Database(e.db)
        try:  # made before the role was built in (a custom role's name then), and held
            with database.transaction() as conn:
                conn.execute(database.sql("INSERT INTO roles (name, description, created_at, "
                                          "updated_at) VALUES ('auditor', 'old', 0, 0)"), ())
                conn.execute(database.sql("INSERT INTO user_roles (user_id, role) SELECT id, "
                                          "'auditor' FROM users WHERE name = 'pat'"), ())
        finally:
            database.close()
        pat = await signed_in(e, "pat", "pat-password")
        assert (await pat.get(e.api("/me"))).json()["auditor"] is False
        assert (await pat.get(e.api("/audit"))).status_code == 403
        roles = [(r["name"], r["source"]) for r in (await e.admin.get(e.api("/roles"))
                                                    ).json()["items"]]
        assert ("auditor", "builtin") in roles and ("auditor", "api") in roles
        held = await e.admin.delete(e.api("/roles/auditor"))
        assert held.status_code == 409 and "held by 1 user" in detail(held)
        await e.admin.patch(e.api("/users/pat"), json={"roles": []})
        assert (await e.admin.delete(e.api("/roles/auditor"))).status_code == 204
        builtin = await e.admin.delete(e.api("/roles/auditor"))
        assert builtin.status_code == 409 and "built in" in detail(builtin)
        await pat.aclose()


async def test_an_export_cut_short_is_recorded_with_what_was_sent(tmp_path: Path) -> None:
    async with env(tmp_path) as e:
        sink = DatabaseAuditSink(e.db)
        for i in range(20_000):  # megabytes of CSV: more than the sockets buffer
            sink.emit(AuditRecord(endpoint="cfgd", method="tools/call", principal=f"p{i}",
                                  tool="echo", note="x" * 200))
        await sink.close()
        async with e.admin.stream("GET", e.api("/audit/export"),
                                  params={"endpoint": "cfgd"}) as export:
            assert export.status_code == 200
            received = 0
            async for chunk in export.aiter_bytes():
                received += len(chunk)
                if received > 100_000:  # some pages in, the reader leaves
                    break
        records: list[dict[str, Any]] = []

        async def recorded() -> bool:
            nonlocal records
            records = [r for r in (await e.admin.get(e.api("/audit"), params={
                "endpoint": "/api/v1"})).json()["items"] if r["method"] == "audit/export"]
            return bool(records)

        await until(recorded, what="the export's record")
        (record,) = records
        sent = int(record["note"].split(" ")[0])
        assert 0 < sent < 20_000, record["note"]
        assert record["note"].endswith("(cut short); filter: endpoint=cfgd")
        assert (record["status"], record["error_message"]) == ("cancelled",
                                                               "api: export cut short")
