"""/api/v1/approvals through a real gateway (JWT auth, an official-SDK upstream, the official SDK
client as the caller): an approver lists, reads, approves and denies with a browser session or
with the bearer JWT the MCP edge accepts for them; anyone not named by the rule is refused
(403), a decision taken twice or too late conflicts (409), an id that is not one is 404
(forged, made-up, or a replayed console link of an approval used up: 409). Administrators and
auditors read every approval and decide none they are not named by. The approvals webhook is
posted to a receiver that checks its signature and the console link."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from typing import Any

import httpx
import httpx2
import orjson
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from quart import Quart, request

from proxy.auth import keys as api_keys
from proxy.people.accounts import Accounts, RoleExists, UserExists
from tests import db_backends
from tests.helpers import jwt_auth, token
from tests.policies.cedar.test_gateway import Bank
from tests.servers import serve
from tests.stack import Urls, gateway_stack

SECRET = "approvals-webhook-secret"
PASSWORD = "p" * 12
RULES = [{"name": "transfers", "endpoints": ["up"], "tools": ["trans*"],
          "approvers": ["group:sre", "user:erin"], "wait_s": 0.2},
         {"name": "wipes", "endpoints": ["other"], "tools": ["wipe"],
          "approvers": ["group:ops"], "wait_s": 0.2}]


@dataclass
class World:
    url: str
    admin: httpx.AsyncClient  # an admin API key
    bank: Bank
    hooks: list[tuple[bytes, str]]  # what the approvals webhook received: body, signature

    def api(self, path: str) -> str:
        return f"{self.url}/api/v1{path}"

    async def person(self, name: str) -> httpx.AsyncClient:
        """A person signed in with a browser session (as the console's pages are)."""
        client = httpx.AsyncClient(timeout=10, headers={"Origin": self.url})
        signed = await client.post(f"{self.url}/signin", data={"name": name,
                                                                "password": PASSWORD})
        assert signed.status_code == 303, signed.text
        return client

    def bearer(self, subject: str, endpoint: str = "up", **claims: Any) -> httpx.AsyncClient:
        """A person with the JWT the MCP edge accepts for them at `endpoint`."""
        jwt = token(sub=subject, **{"aud": f"{self.url}/mcp/{endpoint}", **claims})
        return httpx.AsyncClient(timeout=10, headers={"Authorization": f"Bearer {jwt}"})

    async def call(self, tool: str, arguments: dict[str, Any], endpoint: str = "up",
                   mode: str = "legacy") -> Any:
        """Bob's call through the official SDK client."""
        http = httpx2.AsyncClient(timeout=30, headers={
            "Authorization": f"Bearer {token(sub='bob', aud=f'{self.url}/mcp/{endpoint}')}"})
        async with http, Client(streamable_http_client(f"{self.url}/mcp/{endpoint}",
                                                       http_client=http), mode=mode) as c:
            return await c.call_tool(tool, arguments)


def receiver(hooks: list[tuple[bytes, str]]) -> Quart:
    app = Quart("hooks")

    @app.post("/hook")
    async def hook() -> tuple[str, int]:
        hooks.append((await request.get_data(), request.headers.get("X-Tollhouse-Signature",
                                                                    "")))
        return "", 204

    return app


@asynccontextmanager
async def world(rules: list[dict[str, Any]] | None = None) -> AsyncIterator[World]:
    db = db_backends.url()
    accounts = Accounts(db)
    with suppress(RoleExists):
        accounts.create_role("sre")
    with suppress(UserExists):
        accounts.create_local("carol", PASSWORD, roles=["sre"])  # an approver
        accounts.create_local("dave", PASSWORD)  # no one's approver
        accounts.create_local("audrey", PASSWORD, roles=["auditor"])
        accounts.create_local("root", PASSWORD, admin=True)
    accounts.close()
    _, secret = api_keys.create(db, "ci", [], role="admin")
    bank, hooks = Bank(), []
    async with serve(receiver(hooks)) as hook_url:
        def config(urls: Urls) -> dict[str, Any]:
            up = f"{urls.upstream}/mcp"
            return {"auth": jwt_auth(), "database": {"url": db},
                    "server": {"public_url": urls.gateway},
                    "upstreams": [{"name": "up", "url": up}, {"name": "other", "url": up}],
                    "approvals": rules or RULES,
                    "approvals_webhook": {"url": f"{hook_url}/hook", "secret": SECRET}}

        async with gateway_stack(config, upstream=bank.app(), secret_key="k", client={
                "headers": {"Authorization": f"Bearer {secret}"}}) as site:
            yield World(site.url, site.client, bank, hooks)


async def held(w: World, tool: str = "transfer", endpoint: str = "up",
               **arguments: Any) -> str:
    """Bob's call, held and not decided within wait_s: the pending approval's id."""
    result = await w.call(tool, arguments or {"amount": 7, "to": "zed"}, endpoint)
    assert result.is_error and result.structured_content is not None, result
    assert result.structured_content["code"] == "gateway.approval.pending"
    approval_id: str = result.structured_content["details"]["approval_id"]
    return approval_id


def detail(answer: httpx.Response) -> str:
    body = answer.json()
    assert set(body) == {"detail"}, body
    return str(body["detail"])


async def test_an_approver_decides_with_a_session_or_the_edges_jwt() -> None:
    async with world() as w:
        first = await held(w)
        carol = await w.person("carol")
        listed = await carol.get(w.api("/approvals"))
        assert listed.status_code == 200, listed.text
        (shown,) = listed.json()["items"]
        assert shown["id"] == first and shown["caller"] == "bob" and shown["tool"] == "transfer"
        assert shown["arguments"] == {"amount": 7, "to": "zed"}
        assert shown["url"] == f"{w.url}/console/approvals/{first}"
        approved = await carol.post(w.api(f"/approvals/{first}/approve"),
                                    json={"comment": "looks right"})
        assert approved.status_code == 200, approved.text
        assert approved.json()["status"] == "approved"
        assert approved.json()["decided_by"] == "local:carol"
        again = await carol.post(w.api(f"/approvals/{first}/deny"), json={})
        assert again.status_code == 409 and "approved already" in detail(again)
        ran = await w.call("transfer", {"amount": 7, "to": "zed"})  # the retry runs once
        assert not ran.is_error and ran.content[0].text == "sent 7 to zed"

        # a JWT of the configured issuer: by its groups, or by `user:<subject>`
        second = await held(w, amount=8, to="zed")
        async with w.bearer("frank", groups=["sre"]) as frank, w.bearer("erin") as erin:
            seen = await frank.get(w.api(f"/approvals/{second}"))
            assert seen.status_code == 200 and seen.json()["status"] == "pending"
            denied = await erin.post(w.api(f"/approvals/{second}/deny"),
                                     json={"comment": "not today"})
            assert denied.status_code == 200 and denied.json()["decided_by"] == "erin"
            late = await frank.post(w.api(f"/approvals/{second}/approve"))
            assert late.status_code == 409
            # the JWT opens the approvals' routes only
            assert (await frank.get(w.api("/servers"))).status_code == 401
        refused = await w.call("transfer", {"amount": 8, "to": "zed"})
        assert refused.structured_content["code"] == "gateway.approval.pending"  # a new ask
        await carol.aclose()
    assert w.bank.calls == [("transfer", {"amount": 7, "to": "zed"})]


async def test_who_is_refused() -> None:
    async with world() as w:
        approval_id = await held(w)
        other = await held(w, "wipe", endpoint="other")  # another endpoint's, for "ops"
        dave, carol = await w.person("dave"), await w.person("carol")
        assert (await dave.get(w.api("/approvals"))).json()["items"] == []
        for path in (f"/approvals/{approval_id}/approve", f"/approvals/{approval_id}/deny"):
            answer = await dave.post(w.api(path), json={"comment": "me"})
            assert answer.status_code == 403, answer.text
        assert (await dave.get(w.api(f"/approvals/{approval_id}"))).status_code == 403
        # an approver of one rule decides no other endpoint's approval
        assert [a["id"] for a in (await carol.get(w.api("/approvals"))).json()["items"]] == [
            approval_id]
        assert (await carol.post(w.api(f"/approvals/{other}/approve"))).status_code == 403
        # the caller is not their own approver unless the rule says "self"
        async with w.bearer("bob") as bob:
            assert (await bob.post(w.api(f"/approvals/{approval_id}/approve"))).status_code \
                == 403
        # administrators and auditors read every approval, and decide none they are not
        # named by
        root, audrey = await w.person("root"), await w.person("audrey")
        for reader in (root, audrey, w.admin):
            items = (await reader.get(w.api("/approvals"))).json()["items"]
            assert sorted(a["id"] for a in items) == sorted([approval_id, other])
        assert (await root.post(w.api(f"/approvals/{approval_id}/approve"))).status_code == 403
        assert (await w.admin.post(w.api(f"/approvals/{other}/deny"))).status_code == 403
        assert (await audrey.post(w.api(f"/approvals/{other}/deny"))).status_code == 403
        # unknown, forged and malformed ids; a JWT not of a configured issuer; no Origin
        for bad in ("apr_doesnotexist", "apr_" + "A" * 24, "../../keys", "x" * 300):
            for client in (carol, w.admin):
                got = await client.get(w.api(f"/approvals/{bad}"))
                assert got.status_code == 404, (bad, got.text)
                decided = await client.post(w.api(f"/approvals/{bad}/approve"))
                assert decided.status_code == 404, (bad, decided.text)
        async with w.bearer("frank", groups=["sre"], iss="https://evil.example") as forged:
            assert (await forged.get(w.api("/approvals"))).status_code == 401
        async with httpx.AsyncClient(cookies=carol.cookies) as no_origin:
            answer = await no_origin.post(w.api(f"/approvals/{approval_id}/approve"))
            assert answer.status_code == 403 and "Origin" in detail(answer)
        too_long = await carol.post(w.api(f"/approvals/{approval_id}/deny"),
                                    json={"comment": "x" * 501})
        assert too_long.status_code == 422
        assert (await carol.get(w.api(f"/approvals/{approval_id}"))).json()["status"] == \
            "pending"  # nothing above decided it
        for client in (dave, carol, root, audrey):
            await client.aclose()
    assert w.bank.calls == []


async def test_the_webhook_is_signed_and_links_the_console_page() -> None:
    async with world() as w:
        approval_id = await held(w, amount=123456789, to="zed")
        deadline = asyncio.get_running_loop().time() + 10
        while not w.hooks:  # delivered off the call's path
            assert asyncio.get_running_loop().time() < deadline, "no webhook"
            await asyncio.sleep(0.02)
        ((body, signature),) = w.hooks
    expected = hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
    assert hmac.compare_digest(signature, f"sha256={expected}")
    sent = orjson.loads(body)
    assert sent["type"] == "approval" and sent["id"] == approval_id
    assert sent["url"] == f"{w.url}/console/approvals/{approval_id}"
    assert sent["tool"] == "transfer" and sent["caller"] == "bob"
    assert "arguments" not in sent and b"123456789" not in body


@pytest.mark.parametrize("status", ["approved", "denied"])
async def test_a_decision_through_the_api_releases_the_waiting_call(status: str) -> None:
    async with world([{**RULES[0], "wait_s": 30}]) as w:
        carol = await w.person("carol")

        async def decide() -> None:
            deadline = asyncio.get_running_loop().time() + 10
            while not (items := (await carol.get(w.api("/approvals"))).json()["items"]):
                assert asyncio.get_running_loop().time() < deadline, "nothing held"
                await asyncio.sleep(0.02)
            verb = "approve" if status == "approved" else "deny"
            answer = await carol.post(w.api(f"/approvals/{items[0]['id']}/{verb}"),
                                      json={"comment": "checked"})
            assert answer.status_code == 200, answer.text

        deciding = asyncio.create_task(decide())
        result = await w.call("transfer", {"amount": 1, "to": "zed"})
        await deciding
        await carol.aclose()
    if status == "approved":
        assert not result.is_error and result.content[0].text == "sent 1 to zed"
        assert w.bank.calls == [("transfer", {"amount": 1, "to": "zed"})]
    else:
        assert result.structured_content["code"] == "gateway.approval.denied"
        assert "checked" in result.content[0].text and "local:carol" in result.content[0].text
        assert w.bank.calls == []


def csrf(page: httpx.Response) -> str:
    match = re.search(r'name="csrf" value="([0-9a-f]{64})"', page.text)
    assert match, page.text[:300]
    return match.group(1)


async def test_the_console_pages_list_show_and_decide() -> None:
    async with world() as w:
        approval_id = await held(w, amount=31, to="yolanda")
        other = await held(w, "wipe", endpoint="other")
        carol, dave = await w.person("carol"), await w.person("dave")
        listing = await carol.get(f"{w.url}/console/approvals")
        assert listing.status_code == 200, listing.text
        assert f"/console/approvals/{approval_id}" in listing.text and "yolanda" in listing.text
        assert other not in listing.text  # not hers to see
        page = await carol.get(f"{w.url}/console/approvals/{approval_id}")
        assert page.status_code == 200 and "transfer" in page.text and "Approve" in page.text
        assert "bob" in page.text and "yolanda" in page.text
        for gone in ("apr_madeup", "nope"):
            missing = await carol.get(f"{w.url}/console/approvals/{gone}")
            assert missing.status_code == 404 and "not found" in missing.text
        assert (await carol.get(f"{w.url}/console/approvals/{other}")).status_code == 403
        assert "No call waits" in (await dave.get(f"{w.url}/console/approvals")).text
        refused = await dave.post(f"{w.url}/console/approvals/{approval_id}/approve",
                                  data={"csrf": csrf(await dave.get(
                                      f"{w.url}/console/me/keys")), "comment": "x"})
        assert refused.status_code == 403
        token = csrf(page)
        no_token = await carol.post(f"{w.url}/console/approvals/{approval_id}/deny",
                                    data={"comment": "x"})
        assert no_token.status_code == 403
        denied = await carol.post(f"{w.url}/console/approvals/{approval_id}/deny",
                                  data={"csrf": token, "comment": "wrong payee"})
        assert denied.status_code == 303
        assert denied.headers["location"] == f"/console/approvals/{approval_id}?done=denied"
        after = await carol.get(f"{w.url}{denied.headers['location']}")
        assert 'denied by <span title="">local:carol</span>' in after.text  # as recorded
        assert "wrong payee" in after.text
        assert "Approve" not in after.text
        twice = await carol.post(f"{w.url}/console/approvals/{approval_id}/approve",
                                 data={"csrf": token})
        assert twice.status_code == 409 and "denied already" in twice.text
        # an administrator reads the caller and the decider as every page shows a principal:
        # a person by name (the issuer and subject in its title), each a link to their calls
        root = await w.person("root")
        shown = (await root.get(f"{w.url}/console/approvals/{approval_id}")).text
        assert '<a href="/console/audit?principal=bob" title="not a known person, key or ' \
               'client">bob</a>' in shown
        assert ('denied by <a href="/console/audit?principal=local%3Acarol" '
                'title="tollhouse:local · local:carol">carol</a>') in shown
        assert '/console/audit?principal=' not in after.text  # carol reads no audit log
        for client in (carol, dave, root):
            await client.aclose()
    assert w.bank.calls == []
