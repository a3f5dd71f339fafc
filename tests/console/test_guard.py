"""What every /console/ answer and change passes, without a browser: the signed-out 303 to the
sign-in, administrators' pages refused to others, the CSP and framing headers on every answer
(errors and static files too), a CSRF token and this gateway's Origin on every change, no
change by GET, and the pages' figures and changes going through /api/v1 (audited)."""

from __future__ import annotations

import re
from pathlib import Path

import httpx

from proxy.console.guard import CSP
from tests.api.test_api import env, signed_in


def _csrf(page: httpx.Response) -> str:
    match = re.search(r'name="csrf" value="([0-9a-f]{64})"', page.text)
    assert match, page.text[:500]
    return match.group(1)


async def test_guards(tmp_path: Path) -> None:
    async with env(tmp_path) as e, httpx.AsyncClient(follow_redirects=False) as anonymous:
        out = await anonymous.get(f"{e.url}/console/audit?status=denied")
        assert out.status_code == 303
        assert out.headers["location"] == "/signin?next=%2Fconsole%2Faudit%3Fstatus%3Ddenied"
        assert out.headers["content-security-policy"] == CSP
        assert (await anonymous.get(f"{e.url}/console")).headers["location"] == "/console/"
        static = await anonymous.get(f"{e.url}/console/static/console.css")
        assert static.status_code == 200 and "frame-ancestors 'none'" in static.headers[
            "content-security-policy"]
        signin = await anonymous.get(f"{e.url}/signin")
        assert "/console/static/console.css" in signin.text  # the console's look
        assert "unsafe-inline" not in signin.headers["content-security-policy"]

        root = await signed_in(e, "root", "root-password")
        for path in ("/console/", "/console/servers", "/console/servers/cfgd", "/console/keys",
                     "/console/users", "/console/audit", "/console/usage",
                     "/console/me/connections", "/console/me/keys", "/console/me/connect"):
            page = await root.get(e.url + path)
            assert page.status_code == 200, (path, page.text[:300])
            assert page.headers["content-security-policy"] == CSP
            assert page.headers["x-frame-options"] == "DENY"
            assert "<script>" not in page.text and "style=" not in page.text
        missing = await root.get(f"{e.url}/console/nope")
        assert missing.status_code == 404 and missing.headers["x-frame-options"] == "DENY"
        # a change by GET does not exist
        assert (await root.get(f"{e.url}/console/keys/abc/revoke")).status_code == 405

        token = _csrf(await root.get(f"{e.url}/console/servers"))
        body = {"name": "crm", "url": f"{e.upstream}/mcp", "zones": "loopback"}
        origin = {"Origin": e.url}
        no_token = await root.post(f"{e.url}/console/servers", data=body, headers=origin)
        assert no_token.status_code == 403 and "expired" in no_token.text
        wrong = await root.post(f"{e.url}/console/servers", data={**body, "csrf": "0" * 64},
                                headers=origin)
        assert wrong.status_code == 403
        foreign = await root.post(f"{e.url}/console/servers", data={**body, "csrf": token},
                                  headers={"Origin": "https://evil.example"})
        assert foreign.status_code == 403 and "from this gateway" in foreign.text
        made = await root.post(f"{e.url}/console/servers", data={**body, "csrf": token},
                               headers=origin)
        assert made.status_code == 303 and made.headers["location"] == \
            "/console/servers?done=created"
        listed = await e.admin.get(e.api("/servers/crm"))
        assert listed.status_code == 200 and listed.json()["zones"] == ["loopback"]
        twice = await root.post(f"{e.url}/console/servers", data={**body, "csrf": token},
                                headers=origin)
        assert twice.status_code == 409 and "already exists" in twice.text  # the API's words
        audit = (await e.admin.get(e.api("/audit"), params={"endpoint": "/api/v1"})).json()
        # the console's reads of the audit log are records too (tests/api/test_auditor.py)
        assert [r["method"] for r in audit["items"] if r["method"] != "audit/read"] == [
            "POST /api/v1/servers"] * 2
        assert audit["items"][0]["principal"].startswith("tollhouse:local|")

        pat = await signed_in(e, "pat", "pat-password")
        refused = await pat.get(f"{e.url}/console/servers")
        assert refused.status_code == 403 and "Administrators only" in refused.text
        home = await pat.get(f"{e.url}/console/")
        assert home.status_code == 200 and "Welcome, pat" in home.text
        # a key made by root in the console is not pat's to see or revoke
        page = await root.get(f"{e.url}/console/me/keys")
        made = await root.post(f"{e.url}/console/me/keys", headers=origin, data={
            "name": "roots", "endpoints": "cfgd", "csrf": _csrf(page)})
        assert made.status_code == 201 and "th_" in made.text
        key_id = re.search(r'/console/me/keys/([a-z0-9]{10})/revoke', made.text).group(1)
        mine = await pat.get(f"{e.url}/console/me/keys")
        assert "roots" not in mine.text
        stolen = await pat.post(f"{e.url}/console/me/keys/{key_id}/revoke", headers=origin,
                                data={"csrf": _csrf(mine), "confirm": "yes"})
        assert stolen.status_code == 404
        # a CSRF token is the session's own: pat's is not root's
        other = await root.post(f"{e.url}/console/me/keys/{key_id}/revoke", headers=origin,
                                data={"csrf": _csrf(mine)})
        assert other.status_code == 403
        signout = await pat.post(f"{e.url}/signout", headers=origin)
        assert signout.status_code == 303
        assert (await pat.get(f"{e.url}/console/")).status_code == 303
        for c in (root, pat):
            await c.aclose()
