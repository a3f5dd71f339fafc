"""/api/v1/policies through the real app: Cedar policies created, read, replaced and deleted
by an administrator, validated before they are stored (422 naming the policy and the
attribute), 409 on an id in use, each change audited with its author; a created policy decides
the next call an official SDK client makes, a deleted one stops deciding, and a policy created
through one gateway refuses a call on another gateway on the same database within a poll."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson

from proxy.audit import query
from proxy.audit.summary import MANAGEMENT
from proxy.auth import keys as api_keys
from proxy.config import from_dict
from proxy.mirror import POLL_S
from tests import db_backends, state_backends
from tests.e2e.sdk_client import SdkClient, connect
from tests.helpers import until
from tests.policies.cedar.test_gateway import Bank as Upstream
from tests.servers import serve
from tests.stack import Site, gateway_stack

OPEN = """@id("up-open")
permit(principal, action, resource in Tollhouse::Endpoint::"up");"""
NO_MALLORY = """@reason("transfers to mallory are not allowed")
forbid(principal, action == Tollhouse::Action::"tools/call",
       resource == Tollhouse::Tool::"up/transfer")
when { context.input.to == "mallory" };"""
FILED = """@id("filed")
permit(principal, action == Tollhouse::Action::"tools/call", resource)
when { resource has readOnlyHint && resource.readOnlyHint };"""


@dataclass
class World:
    database: str
    secret: str
    sites: list[Site]

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.secret}"}


@asynccontextmanager
async def world(tmp_path: Path, gateways: int = 1, files: str | None = None
                ) -> AsyncIterator[World]:
    """Gateways on one database in front of the bank's upstream `up`, an admin key for both;
    `files`: a policy file in `[policy] files`."""
    database = db_backends.url()
    _, secret = api_keys.create(database, "ops", [], role="admin")
    bank = Upstream()
    async with AsyncExitStack() as stack:
        upstream = await stack.enter_async_context(serve(bank.app(json=True),
                                                         graceful_timeout=1))
        raw: dict[str, Any] = {"auth": {"mode": "jwt"}, "database": {"url": database},
                               "state": state_backends.state(),
                               "upstreams": [{"name": "up", "url": f"{upstream}/mcp"}]}
        if files is not None:
            (tmp_path / "filed.cedar").write_text(files)
            raw["policy"] = {"files": [str(tmp_path / "*.cedar")]}
        cfg = from_dict(raw, env={})
        sites = [await stack.enter_async_context(gateway_stack(
            cfg, client={"headers": {"Authorization": f"Bearer {secret}"}}))
            for _ in range(gateways)]
        yield World(database, secret, sites)


def decided(database: str) -> list[dict[str, Any]]:
    """The tools/call records, newest first, their policy objects parsed."""
    rows = [r for r in query(database, limit=200) if r["method"] == "tools/call"]
    for row in rows:
        row["policy"] = orjson.loads(row["policy"]) if row["policy"] else None
    return rows


async def create(client: httpx.AsyncClient, text: str, **body: Any) -> httpx.Response:
    return await client.post("/api/v1/policies", json={"text": text, **body})


class Bank:
    """Transfers through an SDK client, counted, and their audit records."""

    def __init__(self, client: SdkClient, database: str) -> None:
        self.client = client
        self.database = database
        self.sent = 0

    async def transfer(self, to: str = "mallory") -> Any:
        self.sent += 1
        return await self.client.call_tool("transfer", {"amount": 5, "to": to})

    async def refused(self, to: str = "mallory") -> bool:
        return bool((await self.transfer(to)).is_error)

    async def allowed(self, to: str = "mallory") -> bool:
        return not await self.refused(to)

    async def records(self) -> list[dict[str, Any]]:
        """Every transfer's record, newest first (written just after each answer)."""
        await until(lambda: len(decided(self.database)) >= self.sent, what="the records")
        return decided(self.database)


async def test_policies_are_created_read_replaced_and_deleted(tmp_path: Path) -> None:
    async with world(tmp_path, files=FILED) as w:
        api = w.sites[0].client
        made = await create(api, NO_MALLORY, id="no-mallory")
        assert made.status_code == 201, made.text
        body = made.json()
        assert (body["id"], body["mode"], body["version"], body["source"], body["file"]) == (
            "no-mallory", "enforce", 1, "api", "api")
        assert body["text"] == NO_MALLORY and body["author"]
        assert body["created_at"] == body["updated_at"]
        listed = (await api.get("/api/v1/policies")).json()["items"]
        assert [(p["id"], p["source"], p["version"]) for p in listed] == [
            ("filed", "config", None), ("no-mallory", "api", 1)]
        assert "readOnlyHint" in listed[0]["text"] and listed[0]["file"].endswith("filed.cedar")
        assert (await api.get("/api/v1/policies/filed")).json()["source"] == "config"
        assert (await api.get("/api/v1/policies/no-mallory")).json() == body
        # replaced: the version moves, the mode may change (here from the text's annotation)
        shadow = "@mode(\"shadow\")\n" + NO_MALLORY
        put = await api.put("/api/v1/policies/no-mallory", json={"text": shadow})
        assert put.status_code == 200, put.text
        assert (put.json()["version"], put.json()["mode"]) == (2, "shadow")
        assert put.json()["updated_at"] >= body["updated_at"]
        again = await api.put("/api/v1/policies/no-mallory",
                              json={"id": "no-mallory", "text": NO_MALLORY, "mode": "enforce"})
        assert (again.json()["version"], again.json()["mode"]) == (3, "enforce")
        # an id given by the text's @id alone
        assert (await create(api, OPEN)).json()["id"] == "up-open"
        assert (await api.delete("/api/v1/policies/no-mallory")).status_code == 204
        assert (await api.get("/api/v1/policies/no-mallory")).status_code == 404
        assert (await api.delete("/api/v1/policies/no-mallory")).status_code == 404
        gone = await api.put("/api/v1/policies/no-mallory", json={"text": NO_MALLORY})
        assert gone.status_code == 404
        assert [p["id"] for p in (await api.get("/api/v1/policies")).json()["items"]] == [
            "filed", "up-open"]


async def test_a_policy_is_validated_before_it_is_stored(tmp_path: Path) -> None:
    async with world(tmp_path) as w:
        api = w.sites[0].client

        async def problem(body: dict[str, Any]) -> dict[str, Any]:
            answer = await api.post("/api/v1/policies", json=body)
            assert answer.status_code == 422, answer.text
            (one,) = answer.json()["detail"]
            assert set(one) == {"loc", "msg", "type"}
            return dict(one)

        unknown = await problem({"id": "bad-attr", "text": (
            "permit(principal, action, resource) when { principal.department == \"x\" };")})
        assert unknown["loc"] == ["body", "text"]
        assert "bad-attr" in unknown["msg"] and "department" in unknown["msg"]
        parse = await problem({"id": "p", "text": "permit(principal, action resource);"})
        assert parse["loc"] == ["body", "text"] and parse["msg"].startswith("policy: api:")
        two = await problem({"id": "two", "text": OPEN + "\n" + FILED.replace("filed", "f2")})
        assert "exactly one policy" in two["msg"]
        assert (await problem({"text": "permit(principal, action, resource);"}))["loc"] == [
            "body", "id"]
        differs = await problem({"id": "other", "text": OPEN})
        assert "up-open" in differs["msg"] and "other" in differs["msg"]
        assert (await problem({"text": "@mode(\"shadow\")\n" + OPEN, "mode": "enforce"}))[
            "loc"] == ["body", "mode"]
        assert (await problem({"text": OPEN, "extra": 1}))["loc"] == ["body", "extra"]
        assert (await problem({"text": OPEN, "mode": "loud"}))["loc"] == ["body", "mode"]
        assert (await problem({"id": "a/b", "text": "permit(principal, action, resource);"}))[
            "loc"] == ["body", "id"]
        assert (await api.get("/api/v1/policies")).json()["items"] == []  # nothing stored


async def test_an_id_in_use_is_a_conflict(tmp_path: Path) -> None:
    async with world(tmp_path, files=FILED) as w:
        api = w.sites[0].client
        assert (await create(api, OPEN)).status_code == 201
        taken = await create(api, OPEN)
        assert taken.status_code == 409 and "up-open" in taken.json()["detail"]
        filed = await create(api, FILED)
        assert filed.status_code == 409 and "config file" in filed.json()["detail"]
        assert (await api.put("/api/v1/policies/filed", json={"text": FILED})).status_code == 409
        assert (await api.delete("/api/v1/policies/filed")).status_code == 409


async def test_each_change_is_audited_with_its_author(tmp_path: Path) -> None:
    async with world(tmp_path) as w:
        api = w.sites[0].client
        me = (await api.get("/api/v1/me")).json()
        author = f"{me['issuer']}|{me['subject']}"
        made = (await create(api, OPEN)).json()
        assert made["author"] == author
        await api.put("/api/v1/policies/up-open", json={"text": OPEN})
        await api.delete("/api/v1/policies/up-open")
        assert (await create(api, OPEN)).status_code == 201
        assert (await create(api, OPEN)).status_code == 409
        records = (await api.get("/api/v1/audit", params={"endpoint": MANAGEMENT})).json()[
            "items"]
        assert [(r["method"], r["principal"], r["note"]) for r in records[::-1]] == [
            ("policies/create", author, "policy up-open version 1"),
            ("policies/replace", author, "policy up-open version 2"),
            ("policies/delete", author, "policy up-open deleted"),
            ("policies/create", author, "policy up-open version 1"),
            ("POST /api/v1/policies", author, "HTTP 409"),
        ]


async def test_a_created_policy_decides_the_next_call_and_a_deleted_one_stops(
        tmp_path: Path) -> None:
    async with world(tmp_path) as w:
        site = w.sites[0]
        async with connect(site.endpoint("up"), headers=w.auth) as client:
            bank = Bank(client, w.database)

            def chained() -> bool:  # the gate is in the chain only while it has a policy
                serving = site.services.serving
                return serving is not None and "cedar" in serving.gateway.live.chain.names

            assert await bank.allowed()  # no policy: nothing decided
            assert (await bank.records())[0]["policy"] is None
            assert not chained()
            assert (await create(site.client, OPEN)).status_code == 201
            assert chained()
            assert (await create(site.client, NO_MALLORY, id="no-mallory")).status_code == 201
            await until(bank.refused, what="the created policy refusing")
            denied = await bank.transfer()
            assert denied.structured_content is not None
            assert denied.structured_content["code"] == "gateway.policy.denied"
            assert denied.structured_content["message"] == "transfers to mallory are not allowed"
            assert await bank.allowed(to="bob")
            bob, refusal = (await bank.records())[:2]
            assert (bob["status"], bob["policy"]["policies"]) == ("ok", ["up-open"])
            assert refusal["status"] == "denied"
            assert refusal["policy"]["policies"] == ["no-mallory"]
            first = refusal["policy"]["version"]
            listed = (await site.client.get("/api/v1/policies")).json()
            assert listed["version"] == first == bob["policy"]["version"]
            # replaced (shadow): the version in the audit moves, nothing is refused
            shadow = "@mode(\"shadow\")\n" + NO_MALLORY
            put = await site.client.put("/api/v1/policies/no-mallory", json={"text": shadow})
            assert put.status_code == 200
            await until(bank.allowed, what="the shadow policy letting the call through")
            latest = (await bank.records())[0]["policy"]
            assert latest["version"] != first and latest["shadow"] == "deny"
            assert (await site.client.get("/api/v1/policies")).json()["version"] == \
                latest["version"]
            assert latest["shadow_policies"] == ["no-mallory"]
            assert (await site.client.delete("/api/v1/policies/no-mallory")).status_code == 204
            assert (await site.client.delete("/api/v1/policies/up-open")).status_code == 204
            assert not chained()
            assert await bank.allowed()
            assert (await bank.records())[0]["policy"] is None  # nothing decides any more


async def test_a_policy_created_on_one_gateway_decides_on_the_other(tmp_path: Path) -> None:
    async with world(tmp_path, gateways=2) as w:
        one, two = w.sites
        async with connect(two.endpoint("up"), headers=w.auth) as client:
            bank = Bank(client, w.database)
            assert await bank.allowed()
            assert (await create(one.client, OPEN)).status_code == 201
            assert (await create(one.client, NO_MALLORY, id="no-mallory")).status_code == 201
            # the other's calls within a poll of its mirrors (its API would read at once)
            await until(bank.refused, deadline_s=POLL_S * 3,
                        what="the policy created on the other gateway refusing")
            seen = await two.client.get("/api/v1/policies/no-mallory")
            assert seen.status_code == 200 and seen.json()["version"] == 1
            assert (await one.client.delete("/api/v1/policies/no-mallory")).status_code == 204
            await until(bank.allowed, deadline_s=POLL_S * 3,
                        what="the policy deleted on the other gateway no longer refusing")
