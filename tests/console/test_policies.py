"""The console's policies page (/console/policies) and the aggregate behind it
(proxy.audit.summary.policy_denials): per Cedar policy, the calls of the last day it refused
(enforce) and those it would have refused but that were let through (shadow), counted from
the audit records' `policy` objects on the run's backend; then through a real gateway whose
policies the official SDK client's calls hit, the page listing every policy with its source,
mode, @reason and counts, the empty state without [policy], and a non-administrator refused."""

from __future__ import annotations

import html
import random
import re
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import Any

import httpx
import pytest
from mcp import MCPError

from proxy.audit import AuditRecord
from proxy.audit import summary as aggregates
from proxy.auth import keys as api_keys
from proxy.demo import demo_app
from proxy.people.accounts import Accounts, UserExists
from proxy.storage.db import Database
from tests import db_backends
from tests.api.test_api import Env, env, signed_in
from tests.e2e.sdk_client import connect
from tests.proxy.audit.test_server_health import write
from tests.stack import Urls, gateway_stack

UNTIL = 1_700_086_400.5
SINCE = UNTIL - 86400
IDS = ("small", "never-mallory", "a'b", "50%_off", "?", "ünï")


def decision(rng: random.Random) -> dict[str, Any] | None:
    """A policy object as the gate writes one (policies.cedar.gate.Gate._outcome), or None
    (a call no policy governs)."""
    if rng.random() < 0.1:
        return None
    picked = rng.sample(IDS, rng.randint(0, 2))
    out: dict[str, Any] = {"version": "v1", "decision": rng.choice(("allow", "deny")),
                           "policies": picked}
    if rng.random() < 0.1:
        out["decision"], out["errors"] = "deny", rng.randint(1, 3)
    if rng.random() < 0.5:
        out["shadow"] = rng.choice(("allow", "deny"))
        out["shadow_policies"] = rng.sample(IDS, rng.randint(0, 2))
        if out["shadow"] == "deny" and rng.random() < 0.2:
            out["shadow_errors"] = rng.randint(1, 2)
    return out


def expected(records: list[AuditRecord]) -> dict[str, Any]:
    """What policy_denials should answer, counted here record by record."""
    enforce: Counter[str] = Counter()
    shadow: Counter[str] = Counter()
    errors = shadow_errors = 0
    for r in records:
        p = r.policy
        if p is None or not SINCE <= r.ts < UNTIL:
            continue
        if p.get("errors"):
            errors += 1
        elif p["decision"] == "deny":
            enforce.update(p["policies"] or [aggregates.NO_PERMIT])
        elif p.get("shadow") == "deny" and p.get("shadow_errors"):
            shadow_errors += 1
        elif p.get("shadow") == "deny":
            shadow.update(p["shadow_policies"] or [aggregates.NO_PERMIT])
    return {"since": SINCE, "until": UNTIL, "errors": errors, "shadow_errors": shadow_errors,
            "items": [
        {"policy": k, "enforce": enforce[k], "shadow": shadow[k]}
        for k in sorted(set(enforce) | set(shadow))]}


@pytest.fixture
def migrated() -> Iterator[Database]:
    with Database(db_backends.url()) as database:
        database.ensure_schema()
        yield database


async def test_denials_per_policy_over_the_day(migrated: Database) -> None:
    rng = random.Random(7)
    edges = (SINCE, UNTIL)
    records = []
    for i in range(800):
        edge = rng.choice(edges)
        ts = rng.choice((edge, edge - 0.001, edge + 0.001, SINCE + rng.random() * 86400,
                         SINCE - rng.random() * 3600, UNTIL + rng.random() * 60))
        records.append(AuditRecord(endpoint=rng.choice(("e0", "e1")), method="tools/call",
                                   request_id=f"r{i}", status="ok", ts=ts,
                                   policy=decision(rng)))
    await write(migrated, records)
    got = aggregates.policy_denials(migrated, since=SINCE, until=UNTIL)
    assert got == expected(records)
    assert got["errors"] and {i["policy"] for i in got["items"]} == {*IDS, aggregates.NO_PERMIT}


async def test_denials_named_one_by_one(migrated: Database) -> None:
    """Each kind of record, and what it adds: a forbid's denial to the forbid, a no-permit
    denial to NO_PERMIT, an allowed call's shadow denial to its shadow policies (a denied
    call's shadow decision adds nothing), an evaluation error to `errors` alone."""
    at = SINCE + 10
    made: list[dict[str, Any]] = [
        {"decision": "deny", "policies": ["f1", "f2"]},
        {"decision": "deny", "policies": ["f1"], "shadow": "deny", "shadow_policies": ["s1"]},
        {"decision": "deny", "policies": []},
        {"decision": "allow", "policies": ["p1"], "shadow": "deny", "shadow_policies": ["s1"]},
        {"decision": "allow", "policies": [], "shadow": "deny", "shadow_policies": []},
        {"decision": "allow", "policies": ["p1"], "shadow": "allow", "shadow_policies": ["p1"]},
        {"decision": "deny", "policies": ["p1"], "errors": 2},
        {"decision": "allow", "policies": ["p1"]},
        {"decision": "allow", "policies": ["p1"], "shadow": "deny", "shadow_policies": ["s1"],
         "shadow_errors": 1},
    ]
    await write(migrated, [AuditRecord(endpoint="e", method="tools/call", request_id=str(i),
                                       ts=at, policy={"version": "v", **p})
                           for i, p in enumerate(made)])
    got = aggregates.policy_denials(migrated, since=SINCE, until=UNTIL)
    assert got["errors"] == 1 and got["shadow_errors"] == 1
    assert got["items"] == [
        {"policy": aggregates.NO_PERMIT, "enforce": 1, "shadow": 1},
        {"policy": "f1", "enforce": 2, "shadow": 0},
        {"policy": "f2", "enforce": 1, "shadow": 0},
        {"policy": "s1", "enforce": 0, "shadow": 1}]
    empty = aggregates.policy_denials(migrated, since=UNTIL, until=UNTIL + 60)
    assert empty == {"since": UNTIL, "until": UNTIL + 60, "errors": 0, "shadow_errors": 0,
                     "items": []}


POLICIES = """
@id("echo-anything")
permit(principal, action == Tollhouse::Action::"tools/call",
       resource == Tollhouse::Tool::"cfgd/echo");

@id("no-secrets")
@reason("secrets are not echoed")
forbid(principal, action == Tollhouse::Action::"tools/call",
       resource == Tollhouse::Tool::"cfgd/echo")
when { context.input.text == "secret" };

@id("add-anything")
permit(principal, action == Tollhouse::Action::"tools/call",
       resource == Tollhouse::Tool::"cfgd/add");

@id("watch-big-adds")
@mode("shadow")
@reason("adds of a thousand or more are reviewed")
forbid(principal, action == Tollhouse::Action::"tools/call",
       resource == Tollhouse::Tool::"cfgd/add")
when { context.input.a.greaterThanOrEqual(decimal("1000.0")) };
"""


@asynccontextmanager
async def policed(tmp_path: Path) -> AsyncIterator[Env]:
    """tests.api.test_api's env (root, pat and an admin key, one upstream cfgd) with the
    Cedar policies above in a file of [policy] files."""
    (tmp_path / "cfgd.cedar").write_text(POLICIES)
    db = db_backends.url("main")
    accounts = Accounts(db)
    with suppress(UserExists):
        accounts.create_local("root", "root-password", admin=True)
        accounts.create_local("pat", "pat-password")
    accounts.close()
    _, secret = api_keys.create(db, "ci", [], role="admin")

    def config(urls: Urls) -> dict[str, Any]:
        return {"server": {"public_url": urls.gateway}, "auth": {"mode": "jwt"},
                "database": {"url": db}, "state": {"url": "memory"},
                "policy": {"files": [str(tmp_path / "*.cedar")]},
                "upstreams": [{"name": "cfgd", "url": f"{urls.upstream}/mcp"}]}

    async with gateway_stack(config, upstream=demo_app(), secret_key="k",
                             client={"headers": {"Authorization": f"Bearer {secret}"}}) as site:
        yield Env(site.url, site.upstream, secret, site.client, db, site.app)


def cells(page: httpx.Response) -> dict[str, list[str]]:
    """The policies table's rows by their first cell's text: the other cells' texts."""
    rows = re.findall(r"<tr><td>(.*?)</tr>", page.text, re.DOTALL)
    out = {}
    for row in rows:
        texts = [html.unescape(re.sub(r"<[^>]+>", "", c)).strip()
                 for c in re.split(r"</td>\s*<td>", row.removesuffix("</td>"))]
        out[texts[0]] = texts[1:]
    return out


async def test_the_page_lists_each_policy_with_its_denials(tmp_path: Path) -> None:
    async with policed(tmp_path) as e:
        auth = {"Authorization": f"Bearer {e.admin_key}"}
        async with connect(f"{e.url}/mcp/cfgd", headers=auth) as client:
            names = {t.name for t in (await client.list_tools()).tools}
            assert names == {"echo", "add"}  # no permit could apply to count
            assert not (await client.call_tool("echo", {"text": "hi"})).is_error
            for _ in range(2):
                assert (await client.call_tool("echo", {"text": "secret"})).is_error
            for a in (1, 1000, 2500):
                assert not (await client.call_tool("add", {"a": a, "b": 1})).is_error
            with pytest.raises(MCPError):
                await client.call_tool("count", {"to": 2})
        root = await signed_in(e, "root", "root-password")
        page = await root.get(f"{e.url}/console/policies")
        assert page.status_code == 200, page.text[:500]
        assert 'href="/console/policies" aria-current="page"' in page.text
        version = re.search(r"Policy version <code>([0-9a-f]{12})</code>", page.text)
        assert version is not None
        file = str(tmp_path / "cfgd.cedar")
        assert cells(page) == {
            "add-anything": [f"{file} (config file)", "enforce", "–", "0", "0"],
            "echo-anything": [f"{file} (config file)", "enforce", "–", "0", "0"],
            "no-secrets": [f"{file} (config file)", "enforce", "secrets are not echoed",
                           "2", "0"],
            "watch-big-adds": [f"{file} (config file)", "shadow",
                               "adds of a thousand or more are reviewed", "0", "2"],
            "(no permit)": ["–", "–", "no policy permits this call", "1", "0"]}
        assert "Would refuse, let through (shadow)" in page.text
        assert "<strong>0</strong> calls" in page.text  # no evaluation error
        records = (await e.admin.get(e.api("/audit"), params={"limit": "20"})).json()["items"]
        decided = [r for r in records if r["method"] == "tools/call"]
        assert len(decided) == 7 and all(version.group(1) in r["policy"] for r in decided)

        pat = await signed_in(e, "pat", "pat-password")
        refused = await pat.get(f"{e.url}/console/policies")
        assert refused.status_code == 403 and "Administrators only" in refused.text
        assert "secrets are not echoed" not in refused.text
        home = await pat.get(f"{e.url}/console/")
        assert "/console/policies" not in home.text  # not in a non-administrator's navigation
        for c in (root, pat):
            await c.aclose()


async def test_without_policies_the_page_says_so(tmp_path: Path) -> None:
    async with env(tmp_path) as e:
        root = await signed_in(e, "root", "root-password")
        page = await root.get(f"{e.url}/console/policies")
        assert page.status_code == 200
        assert "No Cedar policies" in page.text and "<table>" not in page.text
        assert 'href="/console/policies"' in (await root.get(f"{e.url}/console/")).text
        await root.aclose()
        async with httpx.AsyncClient(follow_redirects=False) as anonymous:
            out = await anonymous.get(f"{e.url}/console/policies")
            assert out.status_code == 303
            assert out.headers["location"] == "/signin?next=%2Fconsole%2Fpolicies"
