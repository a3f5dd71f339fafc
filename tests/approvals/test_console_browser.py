"""The console's Approvals pages in a real browser (headless Chromium, axe-core): an approver
signs in at the link a held call's pending result gives, sees the call (caller, tool, the
arguments), approves it with a comment, and the caller's retry runs; the list page and the
approval page pass axe-core's WCAG 2 A/AA check (no serious violation)."""

from __future__ import annotations

import asyncio

from tests.approvals.test_api import PASSWORD, held, world
from tests.console.browser import Background, axe_source, chromium
from tests.console.test_browser import Visit


def test_an_approver_decides_in_the_browser() -> None:
    axe = axe_source()
    with Background(world) as w, chromium() as driver:
        v = Visit(driver, w.url, axe)
        approval_id = asyncio.run(held(w, amount=55, to="ursula"))
        v.open(f"/console/approvals/{approval_id}")  # the link: sign in first
        v.fill("form[action='/signin']", {"name": "carol", "password": PASSWORD})
        assert v.path == f"/console/approvals/{approval_id}"
        assert "ursula" in v.text() and "transfer" in v.text()
        v.keep("approval")
        v.open("/console/approvals")
        assert "ursula" in v.text()
        v.keep("approvals")
        v.open(f"/console/approvals/{approval_id}")
        v.fill("form.inline", {"comment": "payee checked"})
        assert v.path == f"/console/approvals/{approval_id}?done=approved"
        assert "approved by local:carol" in v.text() and "payee checked" in v.text()
        v.keep("approval-approved")
        ran = asyncio.run(w.call("transfer", {"amount": 55, "to": "ursula"}))
    assert not ran.is_error and ran.content[0].text == "sent 55 to ursula"
    assert v.problems == []
