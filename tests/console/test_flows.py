"""Task flows through the web console in a real browser (headless Chromium), each one as a
platform engineer would go from the overview, clicking what the pages show (issue 43 item 6):
create a server and restrict one tool for one group; revoke a leaked key and see its next
call refused in the audit log; find why a call was denied, the rule named; find what a given
person called in a given hour yesterday and which of those calls were refused, with the
reason. Each flow prints how many pages it took; every page is checked with axe-core and kept
as a screenshot in build/console-screenshots/."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import orjson
from selenium.webdriver.support.ui import Select

from tests.conftest import MCP_HEADERS
from tests.console.browser import Background, axe_source, chromium
from tests.console.test_browser import Visit, confirm, edge_tools, stack


class Flow(Visit):
    """A visit that counts the pages a flow loads (each open, and each click that leads to
    a page)."""

    pages = 0

    def open(self, path: str) -> None:
        self.pages += 1
        super().open(path)

    def click(self, element: Any) -> None:
        self.pages += 1
        super().click(element)

    def link(self, text: str) -> None:
        self.click(self.driver.find_element("link text", text))

    def report(self, name: str) -> None:
        print(f"\nflow '{name}': {self.pages} pages")
        self.pages = 0


def call_tool(base: str, key: str, tool: str) -> httpx.Response:
    with httpx.Client(timeout=10) as http:
        return http.post(f"{base}/mcp/crm", content=orjson.dumps(
            {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
                "name": tool, "arguments": {"a": 1, "b": 2}, "_meta": {
                    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                    "io.modelcontextprotocol/clientInfo": {"name": "t", "version": "1"},
                    "io.modelcontextprotocol/clientCapabilities": {}}}}),
            headers={**MCP_HEADERS, "MCP-Protocol-Version": "2026-07-28",
                     "Mcp-Method": "tools/call", "Mcp-Name": tool,
                     "Authorization": f"Bearer {key}"})


def test_task_flows(tmp_path: Path) -> None:
    axe = axe_source()
    with Background(lambda: stack(tmp_path)) as (w, demo), chromium() as driver:
        v = Flow(driver, w.outer, axe)
        v.open("/console/")
        v.fill("form[action='/signin']", {"name": "root", "password": "root-password-1"})
        v.pages = 0
        _server_for_a_group(v, demo)
        key = _leaked_key(v)
        _why_denied(v, key)
        _person_yesterday(v, w)
        assert v.problems == [], "\n".join(v.problems)


def _server_for_a_group(v: Flow, demo: str) -> None:
    """Register a server, then keep the group `contractors` from one of its tools."""
    v.open("/console/")
    v.link("Users and roles")
    v.fill("form[action='/console/roles']", {"name": "contractors"})
    v.link("Servers")
    v.fill("form[action='/console/servers']", {"name": "crm", "url": f"{demo}/mcp"},
           checks=("input[value=loopback]",))
    v.link("crm")
    form = "form[action='/console/servers/crm/groups']"
    Select(v.driver.find_element("id", "g-group")).select_by_visible_text("contractors")
    v.fill(form, {"tools_deny_more": "add"})
    assert v.path == "/console/servers/crm?done=saved"
    row = v.driver.find_element("css selector", "table tbody tr").text
    assert row == "contractors add none", row  # the group's profile, as the page shows it
    v.keep("flow-server-group")
    v.report("create a server and restrict one tool for one group")
    with httpx.Client(cookies=v.cookies(), timeout=10) as http:
        access = http.get(f"{v.base}/api/v1/servers/crm").json()["access"]
    assert access["group_tools"] == {"contractors": {"tools_allow": [], "tools_deny": ["add"]}}


def _leaked_key(v: Flow) -> str:
    """A key in use leaks: revoke it, and see its next call refused in the audit log."""
    v.open("/console/")
    v.link("API keys")
    v.fill("form[action='/console/keys']", {"name": "ci-bot"},
           checks=("input[name=endpoints][value=crm]",))
    leaked = v.driver.find_element("id", "secret").text
    assert edge_tools(v.base, leaked, "crm").status_code == 200
    v.fill("form[action='/console/keys']", {"name": "ci-bot-2"},
           checks=("input[name=endpoints][value=crm]",))
    fresh = v.driver.find_element("id", "secret").text
    v.pages = 0  # the leak is found here: from the overview on
    v.open("/console/")
    v.link("API keys")
    v.click(v.driver.find_element("css selector", "button[aria-label='Revoke ci-bot']"))
    assert "the API key ci-bot" in v.text()
    confirm(v)
    assert edge_tools(v.base, leaked, "crm").status_code == 401  # its next call
    v.link("Overview")
    v.link("Audit")
    v.click(v.driver.find_element("css selector", "table.audit tbody td:nth-child(2) a"))
    assert "endpoint crm" in v.text()  # the endpoint clicked: its records only
    v.click(v.driver.find_element("css selector", "table.audit td.st-denied a"))
    rows = v.driver.find_elements("css selector", "table.audit tbody tr")
    assert "unknown, revoked or expired API key" in rows[0].text, rows[0].text
    assert all("denied" in r.text for r in rows)
    v.keep("flow-leaked-key")
    v.report("revoke a leaked key and see its next call refused")
    return fresh


def _why_denied(v: Flow, key: str) -> None:
    """A call is refused by a Cedar policy: find which rule, and why."""
    with httpx.Client(cookies=v.cookies(), headers={"Origin": v.base}, timeout=10) as http:
        for pid, text in (("crm-open", ('permit(principal, action, resource in '
                                       'Tollhouse::Endpoint::"crm");')),
                          ("no-add", ('@reason("sums over 1 are done in the ledger")\n'
                                     'forbid(principal, action == Tollhouse::Action::'
                                     '"tools/call", resource == Tollhouse::Tool::"crm/add") '
                                     'when { context.input has b && context.input.b > 1 };'))):
            made = http.post(f"{v.base}/api/v1/policies", json={"id": pid, "text": text})
            assert made.status_code == 201, made.text
    refused = call_tool(v.base, key, "add")
    assert refused.status_code in (200, 403), refused.text
    v.open("/console/")
    # the overview's aggregates are up to 15 s old (the API's cache): reloaded until the
    # refusal is counted, as a person would, and counted as the one page it is
    deadline = time.monotonic() + 30
    denials = v.driver.find_element("css selector", "section[aria-labelledby=denials]")
    while "cedar: forbidden by no-add" not in denials.text and time.monotonic() < deadline:
        v.driver.refresh()
        denials = v.driver.find_element("css selector", "section[aria-labelledby=denials]")
    assert "cedar: forbidden by no-add" in denials.text, denials.text
    v.keep("flow-overview")
    row = next(r for r in denials.find_elements("css selector", "tbody tr")
               if "no-add" in r.text)
    v.click(row.find_element("css selector", "td a"))
    v.click(v.driver.find_element("css selector", "table.audit tbody a"))
    text = v.text()
    assert "Refused because\ncedar: forbidden by no-add" in text, text
    v.keep("flow-why-denied")
    v.report("find why a call was denied (the rule named)")


def _person_yesterday(v: Flow, w: Any) -> None:
    """What alice called between 14:00 and 15:00 yesterday, and which calls were refused."""
    day = datetime.now(UTC).date() - timedelta(days=1)
    hour = datetime(day.year, day.month, day.day, 14, tzinfo=UTC).timestamp()
    calls = [(hour + 60, "local:alice", "echo", "ok", None),
             (hour + 600, "local:alice", "add", "denied", "cedar: forbidden by no-add"),
             (hour + 1800, "local:alice", "count", "ok", None),
             (hour + 3000, "local:alice", "add", "denied", "access: tool hidden"),
             (hour - 60, "local:alice", "echo", "ok", None),  # 13:59: the hour before
             (hour + 3660, "local:alice", "echo", "denied", "rate_limit: too many"),
             (hour + 900, "local:bob", "echo", "denied", "access: tool hidden")]
    with w.outer_db.transaction() as conn:  # yesterday's records, as the writer keeps them
        for i, (ts, who, tool, status, reason) in enumerate(calls):
            conn.execute(w.outer_db.sql(
                "INSERT INTO audit (ts, request_id, principal, endpoint, method, tool, status, "
                "denied_reason, duration_ms, bytes_in, bytes_out, era) VALUES "
                "(?, ?, ?, 'crm', 'tools/call', ?, ?, ?, 12.5, 100, 200, 'modern')"),
                (ts, f"y{i}", who, tool, status, reason))
    v.open("/console/")
    v.link("Users and roles")
    v.link("alice")
    v.link("Their MCP requests in the audit log")
    assert "principal alice" in v.text()  # by name, not local:alice
    on = day.isoformat()
    # the date-time inputs, as a person sets them (Chromium's datetime-local takes no typing
    # that does not depend on the locale, so its value is set as the picker would)
    for field, value in (("f-from", f"{on}T14:00"), ("f-to", f"{on}T15:00")):
        v.driver.execute_script("arguments[0].value = arguments[1]",
                                v.driver.find_element("id", field), value)
    v.click(v.driver.find_element("css selector", "form.filters button[type=submit]"))
    rows = [r.text for r in v.driver.find_elements("css selector", "table.audit tbody tr")]
    assert len(rows) == 4 and all(f"{on} 14:" in r for r in rows), rows
    assert [r.split()[5] for r in rows] == ["add", "count", "add", "echo"], rows
    v.keep("flow-person-hour")
    v.click(v.driver.find_element("css selector", "table.audit td.st-denied a"))
    rows = [r.text for r in v.driver.find_elements("css selector", "table.audit tbody tr")]
    assert len(rows) == 2, rows
    assert "access: tool hidden" in rows[0] and "cedar: forbidden by no-add" in rows[1], rows
    assert f"{on} 14:00 to {on} 15:00 UTC" in v.text()  # the period, read back in UTC
    v.keep("flow-person-refused")
    v.report("what a person called in an hour yesterday, and what was refused")
