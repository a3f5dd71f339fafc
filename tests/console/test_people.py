"""A person's page lists what they hold open (browser sessions, MCP sessions, connected
upstream accounts) through /api/v1/users/<name>/sessions, and "End all sessions" ends it all
after a confirmation naming what goes: their browser sessions are signed out (the caller's
own kept when it is theirs), their MCP sessions refused as unknown, their upstream accounts
deleted from the vault; the person stays active with their API keys, and the change is one
audit record. Only administrators may list or end another person's (no browser: the HTML)."""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

from proxy.connect.vault import Vault
from proxy.held import EXTENSION
from tests.api.test_api import Env, detail, env, signed_in

VAULT = {"k1": b"\x01" * 32}  # tests.api.test_api.env's vault key


def services(e: Env) -> Any:
    return e.app.extensions[EXTENSION]


async def management(e: Env, method: str) -> list[tuple[str, str, str]]:
    """(principal, status, note) of the audit records of `method`, as the database holds them."""
    found = services(e)
    await found.gateway.audit.settled()
    with found.database.transaction() as conn:
        rows = conn.execute(found.database.sql(
            "SELECT principal, status, note FROM audit WHERE method = ? ORDER BY ts"),
            (method,)).fetchall()
    return [(str(r[0]), str(r[1]), str(r[2])) for r in rows]


async def test_a_persons_sessions_are_listed_and_ended_all_at_once(tmp_path: Path) -> None:
    async with env(tmp_path, per_user=True, shared_state=True) as e:
        root = await signed_in(e, "root", "root-password")
        pat_browser = await signed_in(e, "pat", "pat-password")
        pat_other = await signed_in(e, "pat", "pat-password")
        pat = (await e.admin.get(e.api("/users/pat"))).json()
        principal = f"{pat['issuer']}|{pat['subject']}"
        store = services(e).stores.sessions
        session = await store.create("cfgd", principal, None, "2025-11-25")
        other = await store.create("cfgd", "someone|else", None, "2025-11-25")
        Vault(services(e).database, VAULT).put("gh", principal, {"access_token": "at-1"})
        key = await pat_browser.post(e.api("/me/keys"), json={"name": "laptop", "endpoints": ["cfgd"]},
                                     headers={"Origin": e.url})
        assert key.status_code == 201, key.text

        listed = await e.admin.get(e.api("/users/pat/sessions"))
        assert listed.status_code == 200, listed.text
        body = listed.json()
        assert body["user"] == "pat" and body["browser_sessions"] == 2
        assert [(s["endpoint"], s["id_hash"], s["protocol_version"])
                for s in body["mcp_sessions"]] == [("cfgd", session.id_hash, "2025-11-25")]
        assert session.id not in listed.text  # the id is a secret: its hash only
        assert body["upstream_accounts"] == [{"upstream": "gh", "status": "connected"}]

        page = await root.get(f"{e.url}/console/users/pat")
        assert page.status_code == 200
        text = html.unescape(page.text)
        assert "2 signed in to the console" in text and session.id_hash in text
        assert "<td>gh</td><td>connected</td>" in text and "End all sessions…" in text

        csrf = page.text.split('name="csrf" value="', 1)[1].split('"', 1)[0]
        end = f"{e.url}/console/users/pat/sessions/end"
        asked = await root.post(end, data={"csrf": csrf}, headers={"Origin": e.url})
        assert asked.status_code == 200  # the confirmation, naming what goes; nothing ended
        said = html.unescape(asked.text)
        assert "End every session of pat?" in said and "2 browser sessions" in said
        assert f"the MCP session at cfgd (hash {session.id_hash})" in said
        assert "the connected gh account (connected)" in said
        assert (await pat_browser.get(e.api("/me"))).status_code == 200

        done = await root.post(end, data={"csrf": csrf, "confirm": "yes"},
                               headers={"Origin": e.url})
        assert done.status_code == 303
        assert done.headers["Location"] == "/console/users/pat?done=ended"
        for client in (pat_browser, pat_other):  # signed out everywhere
            assert (await client.get(e.api("/me"))).status_code == 401
        assert await store.get(session.id) is None
        assert await store.get(other.id) is not None  # nobody else's
        assert Vault(services(e).database, VAULT).statuses(principal) == {}
        after = (await e.admin.get(e.api("/users/pat/sessions"))).json()
        assert after == {"user": "pat", "browser_sessions": 0, "mcp_sessions": [],
                         "upstream_accounts": []}
        # still a person, with their keys: they sign in again
        again = await signed_in(e, "pat", "pat-password")
        keys = (await again.get(e.api("/me/keys"))).json()["items"]
        assert [k["status"] for k in keys] == ["active"]
        records = await management(e, "people/end-sessions")
        assert len(records) == 1
        who, status, note = records[0]
        assert who == "tollhouse:local|local:root", who
        assert status == "ok" and note.startswith("pat (") and "browser sessions 2" in note
        assert "MCP sessions 1" in note and "upstream accounts 1" in note
        for client in (root, pat_browser, pat_other, again):
            await client.aclose()


async def test_only_administrators_list_or_end_a_persons_sessions(tmp_path: Path) -> None:
    async with env(tmp_path) as e:
        pat = await signed_in(e, "pat", "pat-password")
        assert (await pat.get(e.api("/users/root/sessions"))).status_code == 403
        refused = await pat.delete(e.api("/users/root/sessions"), headers={"Origin": e.url})
        assert refused.status_code == 403
        missing = await e.admin.get(e.api("/users/nobody/sessions"))
        assert missing.status_code == 404 and detail(missing) == "user 'nobody' not found"
        gone = await e.admin.delete(e.api("/users/nobody/sessions"))
        assert gone.status_code == 404
        # an administrator ending their own keeps the session they asked from
        root = await signed_in(e, "root", "root-password")
        elsewhere = await signed_in(e, "root", "root-password")
        ended = await root.delete(e.api("/users/root/sessions"), headers={"Origin": e.url})
        assert ended.status_code == 200 and ended.json()["browser_sessions"] == 1
        assert (await root.get(e.api("/me"))).status_code == 200
        assert (await elsewhere.get(e.api("/me"))).status_code == 401
        for client in (pat, root, elsewhere):
            await client.aclose()
