"""The web console in a real browser (headless Chromium through Selenium): an administrator
signs in, registers a server, edits its tool profile and sees the change on the MCP edge,
creates and revokes a key, adds a Cedar policy and sees it on the policies page, filters and
exports the audit log, opens the audit evidence page; a person connects and disconnects their
upstream account and makes a key of their own; an auditor reads the evidence page and the
audit log (a read that is itself recorded) and is refused a change. Every page is checked
with axe-core (no serious violations) and saved as a screenshot in
build/console-screenshots/."""

from __future__ import annotations

import csv
import io
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import orjson
from selenium.common.exceptions import WebDriverException
from selenium.webdriver.support.ui import WebDriverWait

from proxy.audit import query
from proxy.demo import demo_app
from proxy.people.accounts import Accounts
from tests.conftest import MCP_HEADERS
from tests.console.browser import SHOTS, Background, axe_source, chromium, serious_violations
from tests.e2e.test_connect import PEOPLE, world
from tests.servers import serve


@asynccontextmanager
async def stack(tmp_path: Path) -> AsyncIterator[tuple[Any, str]]:
    async with world(tmp_path, inner_host="127.0.0.2") as w, serve(demo_app(), graceful_timeout=1) as demo:
        accounts = Accounts(w.outer_db)
        accounts.create_local("root", "root-password-1", admin=True)
        accounts.create_local("dora", "dora-password-1", admin=True)
        accounts.create_local("ava", "ava-password-1", roles=["auditor"])
        # people who chose their own names at an identity provider: one taken, one a path
        for sub, name in (("s-dora", "dora"), ("s-path", "x/../../servers/crm")):
            accounts.upsert_federated(IDP, sub, name, frozenset(), False)
        with w.outer_db.transaction() as conn:  # such names as stored before the name rule
            for sub, name in LEGACY.items():
                conn.execute(w.outer_db.sql(
                    "INSERT INTO users (id, name, issuer, subject, is_admin, groups, created_at) "
                    "VALUES (?, ?, ?, ?, 0, '', 0)"), (sub[-8:], name, IDP, sub))
        yield w, demo


IDP = "https://idp.example"
LEGACY = {"legacy-1": "dora#5715d2", "legacy-2": "y/../../servers/crm"}


class Visit:
    """The browser on the gateway: open pages, fill forms, check and keep each page."""

    def __init__(self, driver: Any, base: str, axe: str) -> None:
        self.driver, self.base, self.axe = driver, base, axe
        self.problems: list[str] = []

    def open(self, path: str) -> None:
        self.driver.get(self.base + path if path.startswith("/") else path)

    @property
    def path(self) -> str:
        parts = urlsplit(self.driver.current_url)
        return parts.path + (f"?{parts.query}" if parts.query else "")

    def text(self) -> str:
        return str(self.driver.find_element("tag name", "body").text)

    def fill(self, form: str, values: dict[str, str], *, checks: tuple[str, ...] = ()) -> None:
        """Fill the form matching CSS `form` and submit it."""
        element = self.driver.find_element("css selector", form)
        for name, value in values.items():
            field = element.find_element("name", name)
            field.clear()
            field.send_keys(value)
        for selector in checks:
            box = element.find_element("css selector", selector)
            if not box.is_selected():
                box.click()
        self.click(element.find_element("css selector", "button[type=submit]"))

    def click(self, element: Any) -> None:
        """Click, and wait for the page it leads to (a click does not wait for a load)."""
        html = self.driver.find_element("tag name", "html")
        element.click()
        # mid-navigation Chromium may answer "node does not belong to the document" rather
        # than "stale": either means the old page is gone
        wait = WebDriverWait(self.driver, 20, ignored_exceptions=(WebDriverException,))
        wait.until(_gone(html))
        wait.until(lambda d: d.execute_script("return document.readyState") == "complete")

    def keep(self, name: str) -> None:
        """The page's screenshot, and its axe-core check."""
        SHOTS.mkdir(parents=True, exist_ok=True)
        self.driver.save_screenshot(str(SHOTS / f"{name}.png"))
        self.problems += [f"{name}: {v}" for v in serious_violations(self.driver, self.axe)]

    def cookies(self) -> dict[str, str]:
        return {c["name"]: c["value"] for c in self.driver.get_cookies()}


def _gone(element: Any) -> Any:
    def check(driver: Any) -> bool:
        try:
            element.is_enabled()
        except WebDriverException:
            return True
        return False

    return check


def edge_tools(base: str, key: str, endpoint: str) -> httpx.Response:
    with httpx.Client(timeout=10) as http:
        return http.post(f"{base}/mcp/{endpoint}", content=orjson.dumps(
            {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"_meta": {
                "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                "io.modelcontextprotocol/clientInfo": {"name": "t", "version": "1"},
                "io.modelcontextprotocol/clientCapabilities": {}}}}),
            headers={**MCP_HEADERS, "MCP-Protocol-Version": "2026-07-28",
                     "Mcp-Method": "tools/list", "Authorization": f"Bearer {key}"})


def test_console_in_a_browser(tmp_path: Path) -> None:
    axe = axe_source()
    with Background(lambda: stack(tmp_path)) as (w, demo), chromium() as driver:
        v = Visit(driver, w.outer, axe)
        _administrator(v, demo)
        _hostile_names(v, w)
        _person(v, w)
        _auditor(v, w)
        assert v.problems == [], "\n".join(v.problems)


def _administrator(v: Visit, demo: str) -> None:
    v.open("/console/audit?status=ok")
    assert v.path == "/signin?next=%2Fconsole%2Faudit%3Fstatus%3Dok"  # 303 to the sign-in
    v.keep("signin")
    v.fill("form[action='/signin']", {"name": "root", "password": "root-password-1"})
    assert v.path == "/console/audit?status=ok"
    v.open("/console/")
    assert "MCP requests in the last hour" in v.text() and "Usage outbox backlog" in v.text()
    v.keep("overview")

    v.open("/console/servers")
    assert "config file (read-only)" in v.text()  # gh, from the config file
    v.fill("form[action='/console/servers']", {"name": "crm", "url": f"{demo}/mcp"},
           checks=("input[value=loopback]",))
    assert v.path == "/console/servers?done=created" and "crm" in v.text()
    v.keep("servers")

    v.open("/console/keys")
    v.fill("form[action='/console/keys']", {"name": "robot"},
           checks=("input[name=endpoints][value=crm]",))
    secret = v.driver.find_element("id", "secret").text
    assert secret.startswith("th_")
    v.keep("keys-created")
    tools = edge_tools(v.base, secret, "crm")
    assert {t["name"] for t in tools.json()["result"]["tools"]} == {"echo", "add", "count"}

    v.open("/console/servers/crm")
    v.fill("form[action='/console/servers/crm']", {"tools_deny": "add"})
    assert v.path == "/console/servers/crm?done=saved"
    assert v.driver.find_element("id", "a-tools_deny").get_attribute("value") == "add"
    v.keep("server")
    tools = edge_tools(v.base, secret, "crm")  # the profile holds from the next call
    assert {t["name"] for t in tools.json()["result"]["tools"]} == {"echo", "count"}

    v.open("/console/keys")
    v.click(v.driver.find_element("css selector", "button[aria-label='Revoke robot']"))
    assert "the API key robot" in v.text()  # asked first, naming the key
    v.keep("keys-revoke-confirm")
    confirm(v)
    assert v.path == "/console/keys?done=revoked" and "revoked" in v.text()
    v.keep("keys")
    assert edge_tools(v.base, secret, "crm").status_code == 401

    # a Cedar policy added through the API (as the console's session), then its page
    with httpx.Client(cookies=v.cookies(), headers={"Origin": v.base}, timeout=10) as http:
        made = http.post(f"{v.base}/api/v1/policies", json={
            "id": "crm-for-everyone",
            "text": '@reason("crm is open to all")\npermit(principal, action, '
                    'resource in Tollhouse::Endpoint::"crm");'})
    assert made.status_code == 201, made.text
    v.open("/console/policies")
    text = v.text()
    assert "crm-for-everyone" in text and "crm is open to all" in text
    v.keep("policies")

    v.open("/console/users")
    v.fill("form[action='/console/users']", {"name": "carol", "password": "carol-pass-1"})
    assert "carol" in v.text()
    v.keep("users")
    v.open("/console/users/carol")  # a person's page: their keys, calls, what they hold open
    text = v.text()
    assert "0 signed in to the console" in text and "No MCP session" in text, text
    v.keep("person")
    v.click(v.driver.find_element("css selector", "form[action$='/sessions/end'] button"))
    assert "End every session of carol?" in v.text() and "0 browser sessions" in v.text()
    v.keep("person-end-sessions-confirm")
    confirm(v)
    assert v.path == "/console/users/carol?done=ended", v.text()

    v.open("/console/audit")
    v.fill("form.filters", {"endpoint": "/api/v1"})
    assert "endpoint=%2Fapi%2Fv1" in v.path
    text = v.text()
    assert "PATCH /api/v1/servers/crm" in text and "DELETE /api/v1/keys/" in text
    assert "tools/list" not in text  # filtered to the management API's changes
    v.keep("audit")
    link = v.driver.find_element("link text", "CSV").get_attribute("href")
    with httpx.Client(cookies=v.cookies(), timeout=10) as http:
        exported = http.get(link)
    rows = list(csv.DictReader(io.StringIO(exported.text)))
    assert {r["endpoint"] for r in rows} == {"/api/v1"}
    assert "PATCH /api/v1/servers/crm" in {r["method"] for r in rows}
    v.click(v.driver.find_element("css selector", "table.audit tbody a"))
    text = v.text()  # the principal by name, its issuer and subject beside it
    assert v.path.startswith("/console/audit/") and "Principal\nroot (person: " \
        "tollhouse:local · local:root" in text, text
    v.keep("audit-record")

    v.open("/console/usage?period=day")
    assert "Tool calls (tools/call) over the last day" in v.text()
    v.keep("usage")

    v.open("/console/evidence")
    text = v.text()
    assert "The audit chain is off" in text and "No export" in text
    v.keep("evidence")


def _hostile_names(v: Visit, w: Any) -> None:
    """Save and Delete on the rows of people whose names collide with an administrator's or
    read as a path: each click changes that row's person and nothing else."""
    accounts = Accounts(w.outer_db)
    fed = {u.subject: u.name for u in accounts.list() if u.issuer == IDP}
    assert "#" not in fed["s-dora"] and "/" not in fed["s-path"]
    for name in (fed["s-dora"], fed["s-path"], *LEGACY.values()):
        v.open("/console/users")
        v.click(_button(v, f"Save {name}"))
        assert v.path == "/console/users?done=saved", (name, v.text())
        v.click(_button(v, f"Delete {name}"))
        assert f"the person {name}" in v.text(), (name, v.text())
        confirm(v)
        assert v.path == "/console/users?done=deleted", (name, v.text())
    dora = accounts.by_name("dora")
    assert dora is not None and dora.is_admin
    assert {u.issuer for u in accounts.list()} == {"tollhouse:local"}  # each row it named
    v.open("/console/servers/crm")
    assert v.driver.find_element("id", "a-tools_deny").get_attribute("value") == "add"
    v.click(v.driver.find_element("css selector", "form.signout button"))
    assert v.path.startswith("/signin")


def confirm(v: Visit) -> None:
    """Press the confirmation page's button (a destructive change asks first)."""
    v.click(v.driver.find_element("css selector", "main form.danger button[type=submit]"))


def _button(v: Visit, label: str) -> Any:
    found = [b for b in v.driver.find_elements("css selector", "button[aria-label]")
             if b.get_attribute("aria-label") == label]
    assert len(found) == 1, label
    return found[0]


def _person(v: Visit, w: Any) -> None:
    password, upstream_user, upstream_password = PEOPLE["alice"]
    v.open("/console/me/connections")
    v.fill("form[action='/signin']", {"name": "alice", "password": password})
    assert v.path == "/console/me/connections"
    assert "not connected" in v.text()
    v.keep("connections")
    v.click(v.driver.find_element("link text", "Connect"))
    v.keep("connect-intro")  # the connect page, in the console's look
    v.click(v.driver.find_element("partial link text", "Continue"))
    v.fill("form[action='/signin']", {"name": upstream_user, "password": upstream_password})
    v.keep("consent")
    v.click(v.driver.find_element("css selector", "button[value=allow]"))
    assert "is connected" in v.text()
    v.open("/console/me/connections")
    assert "connected" in v.text() and "not connected" not in v.text()
    v.click(v.driver.find_element("css selector", "button[aria-label='Disconnect gh']"))
    assert v.path == "/console/me/connections?done=disconnected" and "not connected" in v.text()

    v.open("/console/servers")  # an administrator's page
    assert "Administrators only" in v.text()
    v.open("/console/me/keys")
    v.fill("form[action='/console/me/keys']", {"name": "laptop"},
           checks=("input[name=endpoints][value=gh]",))
    assert v.driver.find_element("id", "secret").text.startswith("th_")
    v.keep("my-keys")
    v.open("/console/me/connect")
    text = v.text()
    assert f"{w.outer}/mcp/gh" in text and "Claude Code" in text and "Cursor" in text
    v.keep("connect-a-client")
    changes = {(r["method"], r["status"]): r["principal"]
               for r in query(w.outer_db, endpoint="/api/v1", limit=100)}
    assert changes[("DELETE /api/v1/me/connections/gh", "ok")] == "tollhouse:local|local:alice"
    assert changes[("POST /api/v1/me/keys", "ok")] == "tollhouse:local|local:alice"
    v.click(v.driver.find_element("css selector", "form.signout button"))


def _auditor(v: Visit, w: Any) -> None:
    """An auditor reads the audit log and the evidence page; a form they send is refused,
    and their read of the audit log is itself a record."""
    v.open("/console/evidence")
    v.fill("form[action='/signin']", {"name": "ava", "password": "ava-password-1"})
    assert v.path == "/console/evidence" and "Tamper evidence" in v.text()
    nav = v.driver.find_element("css selector", "nav").text
    assert "Audit evidence" in nav and "Servers" not in nav
    v.keep("evidence-auditor")
    v.open("/console/audit?status=ok")
    assert "Audit log" in v.text()
    v.open("/console/me/keys")
    v.fill("form[action='/console/me/keys']", {"name": "nope"})
    assert "Auditors change nothing" in v.text()
    v.keep("auditor-refused")
    reads = [r for r in query(w.outer_db, endpoint="/api/v1", limit=100)
             if r["principal"] == "tollhouse:local|local:ava"]
    assert [r["method"] for r in reads] == ["audit/read"]
    assert reads[0]["note"].endswith("filter: status=ok&limit=50")
