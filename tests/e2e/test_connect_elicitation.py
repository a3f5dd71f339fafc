"""The connect prompt as a URL elicitation (issue 38 item 5), end to end with the official SDK
clients: a caller not connected to a per_user upstream whose client declared URL-mode
elicitation gets a connect link (-32042 in 2025-11-25, an input_required result in 2026-07-28)
that works once, for that caller alone, for `server.connect_link_ttl_s`; after the person
connects through it the client's retry goes through. A client that declared nothing keeps seed
004's -32000 hint. The world (a second Tollhouse as the upstream's authorization server) is
tests/e2e/test_connect.py's."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import httpx2
import orjson
import pytest
from mcp import Client, MCPError, UrlElicitationRequiredError
from mcp.client.streamable_http import streamable_http_client
from mcp_types import ElicitResult

from proxy.audit import query
from tests import state_backends
from tests.e2e.sdk_client import connect as sdk_connect
from tests.e2e.test_connect import PEOPLE, World, sign_in, world
from tests.e2e.test_oauth_sdk import Browser

LEGACY_INIT = {"protocolVersion": "2025-11-25", "clientInfo": {"name": "raw", "version": "1"}}
URL_CAPS = {"elicitation": {"url": {}}}


def auth(w: World, person: str) -> dict[str, str]:
    return {"authorization": f"Bearer {w.mcp_token(person)}"}


async def initialize(w: World, person: str, capabilities: dict[str, Any],
                     via: str | None = None) -> dict[str, Any]:
    """A raw legacy initialize through the gateway: the JSON-RPC answer."""
    async with httpx.AsyncClient(timeout=10) as client:
        answer = await client.post(
            f"{via or w.outer}/mcp/gh", content=orjson.dumps({
                "jsonrpc": "2.0", "id": 1, "method": "initialize",
                "params": {**LEGACY_INIT, "capabilities": capabilities}}),
            headers={"content-type": "application/json",
                     "accept": "application/json, text/event-stream", **auth(w, person)})
    assert answer.status_code == 200, answer.text
    body: dict[str, Any] = answer.json()
    return body


async def link_for(w: World, person: str, via: str | None = None) -> str:
    """The connect link a URL-elicitation client of `person` is given."""
    error = (await initialize(w, person, URL_CAPS, via))["error"]
    assert error["code"] == -32042
    (elicitation,) = error["data"]["elicitations"]
    url: str = elicitation["url"]
    return url


async def browser(w: World, person: str) -> httpx.AsyncClient:
    http = httpx.AsyncClient(follow_redirects=False, timeout=10)
    await sign_in(http, w.outer, person, PEOPLE[person][0])
    return http


async def follow(w: World, person: str, url: str, start_via: str | None = None) -> None:
    """`person` opens the link signed in, sees what will be linked, goes on to the upstream's
    authorization server, signs in there as their upstream account and allows; back at the
    gateway, connected. `start_via`: the replica that serves the going on."""
    http = await browser(w, person)
    try:
        intro = await http.get(url)
        assert intro.status_code == 200, intro.text
        assert "gh" in intro.text and person in intro.text
        go = url + "&start=1"
        if start_via is not None:
            go = start_via + go.removeprefix(w.outer)
        start = await http.get(go)
        assert start.status_code == 303, start.text
        _, upstream_user, upstream_password = PEOPLE[person]
        upstream = Browser(w.inner, httpx.AsyncClient(follow_redirects=False, timeout=10),
                           user=upstream_user, password=upstream_password)
        back = await upstream.consent(start.headers["location"])
        await upstream.http.aclose()
        done = await http.get(back)
        assert done.status_code == 200 and "connected" in done.text, done.text
    finally:
        await http.aclose()


async def opened(w: World, person: str, url: str, start: bool = False) -> httpx.Response:
    http = await browser(w, person)
    try:
        return await http.get(url + ("&start=1" if start else ""))
    finally:
        await http.aclose()


def records(w: World) -> list[dict[str, Any]]:
    return list(query(w.outer_db, limit=200))


def token_of(url: str) -> str:
    return parse_qs(urlsplit(url).query)["link"][0]


async def test_legacy_sdk_client_gets_32042_follows_it_and_its_retry_goes_through(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    asked: list[Any] = []

    async def on_elicit(context: Any, params: Any) -> ElicitResult:
        asked.append(params)
        return ElicitResult(action="accept")

    endpoint = ""
    async with world(tmp_path) as w:
        endpoint = f"{w.outer}/mcp/gh"
        # not connected: the initialize itself is answered with the link
        with pytest.raises(MCPError) as refused:
            async with sdk_connect(endpoint, headers=auth(w, "alice"),
                                   elicitation_callback=on_elicit):
                pass
        assert refused.value.code == -32042
        (first,) = UrlElicitationRequiredError.from_error(refused.value.error).elicitations
        assert first.mode == "url" and first.elicitation_id
        assert first.url.startswith(f"{w.outer}/connect/gh?link=")
        assert first.message == "Connect your gh account to Tollhouse to continue."
        assert w.probe.calls == []  # nothing reached the upstream
        await follow(w, "alice", first.url)
        async with sdk_connect(endpoint, headers=auth(w, "alice"),
                               elicitation_callback=on_elicit) as client:
            result = await client.call_tool("echo", {"text": "alice"})
            assert result.content[0].text == "alice"
            # a used link is refused, whoever opens it
            again = await opened(w, "alice", first.url, start=True)
            assert again.status_code == 403 and "used or has expired" in again.text
            # disconnected mid-session: the session's declared capability still counts
            http = await browser(w, "alice")
            gone = await http.delete(f"{w.outer}/api/v1/me/connections/gh",
                                     headers={"Origin": w.outer})
            assert gone.status_code == 204
            await http.aclose()
            with pytest.raises(MCPError) as mid:
                await client.call_tool("echo", {"text": "alice"})
            assert mid.value.code == -32042
            (second,) = UrlElicitationRequiredError.from_error(mid.value.error).elicitations
            assert second.url != first.url and second.elicitation_id != first.elicitation_id
            await follow(w, "alice", second.url)
            retried = await client.call_tool("echo", {"text": "alice again"})
            assert retried.content[0].text == "alice again"
        assert asked == []  # an error, never a request on the stream
        tokens = [token_of(first.url), token_of(second.url)]
    audit = records(w)
    not_connected = [r for r in audit if r["error_message"] == "upstream_not_connected"]
    assert sorted(r["method"] for r in not_connected) == ["initialize", "tools/call"]
    refusal = [r for r in audit if r["denied_reason"] == "connect_link_unusable"]
    assert len(refusal) == 1 and refusal[0]["principal"] == "tollhouse:local|local:alice"
    # never in the audit log or the gateway's log lines (the test's own HTTP clients log the
    # URLs they fetch: not the gateway's)
    lines = [r.getMessage() for r in caplog.records
             if not r.name.startswith(("httpx", "httpcore", "mcp."))]
    seen = orjson.dumps(audit).decode() + "\n".join(lines)
    assert not any(token in seen for token in tokens)


async def test_a_link_opened_by_another_person_is_refused_audited_and_kept_for_its_owner(
        tmp_path: Path) -> None:
    async with world(tmp_path) as w:
        url = await link_for(w, "alice")
        for start in (False, True):
            foreign = await opened(w, "bob", url, start=start)
            assert foreign.status_code == 403 and "someone else" in foreign.text
        await follow(w, "alice", url)  # still hers
        ok = await w.call("alice")
        assert ok.json()["result"]["content"][0]["text"] == "alice", ok.text
        assert (await w.call("bob")).json()["error"]["code"] == -32000  # bob: not connected
    foreign_records = [r for r in records(w) if r["denied_reason"] == "connect_link_foreign"]
    assert [r["principal"] for r in foreign_records] == ["tollhouse:local|local:bob"] * 2
    assert all(r["status"] == "denied" and token_of(url) not in (r["note"] or "")
               for r in foreign_records)


async def test_a_link_expires_after_its_ttl(tmp_path: Path) -> None:
    now = [time.time()]
    async with world(tmp_path, wall_clock=lambda: now[0]) as w:
        url = await link_for(w, "alice")
        now[0] += 299  # server.connect_link_ttl_s defaults to 300
        assert (await opened(w, "alice", url)).status_code == 200
        now[0] += 2
        late = await opened(w, "alice", url, start=True)
        assert late.status_code == 403 and "expired" in late.text
        later = await link_for(w, "alice")  # the retry gets a fresh one, which works
        await follow(w, "alice", later)
        assert (await w.call("alice")).json()["result"]["content"][0]["text"] == "alice"


async def test_a_link_for_one_upstream_opens_no_other(tmp_path: Path) -> None:
    async with world(tmp_path) as w:
        url = await link_for(w, "alice")
        elsewhere = url.replace("/connect/gh?", "/connect/nope?")
        assert (await opened(w, "alice", elsewhere)).status_code == 404
        forged = url.split("link=")[0] + "link=" + "A" * 43
        assert (await opened(w, "alice", forged)).status_code == 403


async def test_a_client_without_url_elicitation_keeps_the_32000_hint(tmp_path: Path) -> None:
    async with world(tmp_path) as w:
        for caps in ({}, {"elicitation": {"form": {}}}, {"elicitation": {}}):
            error = (await initialize(w, "alice", caps))["error"]
            assert error == {"code": -32000, "message":
                             f"Connect your gh account first: {w.outer}/connect/gh"}
        with pytest.raises(MCPError) as refused:  # the SDK with no elicitation callback
            async with sdk_connect(f"{w.outer}/mcp/gh", headers=auth(w, "alice")):
                pass
        assert refused.value.code == -32000
        hint = await w.call("alice")  # a sessionless legacy call declares nothing
        assert hint.json()["error"]["code"] == -32000
    audit = [r for r in records(w) if r["error_message"] == "upstream_not_connected"]
    assert len(audit) == 5


async def test_modern_sdk_client_gets_input_required_and_its_retry_goes_through(
        tmp_path: Path) -> None:
    async with world(tmp_path) as w:
        urls: list[str] = []

        async def on_elicit(context: Any, params: Any) -> ElicitResult:
            assert params.mode == "url"
            urls.append(params.url)
            await follow(w, "alice", params.url)  # the person connects, then the SDK retries
            return ElicitResult(action="accept")

        http = httpx2.AsyncClient(headers=auth(w, "alice"), timeout=30)
        async with http, Client(streamable_http_client(f"{w.outer}/mcp/gh", http_client=http),
                                mode="2026-07-28", elicitation_callback=on_elicit) as client:
            result = await client.call_tool("echo", {"text": "modern alice"})
            assert result.content[0].text == "modern alice"
        assert len(urls) == 1 and urls[0].startswith(f"{w.outer}/connect/gh?link=")
        (echo,) = w.probe.posts("tools/call")  # the retry, as the upstream got it
        params = echo.rpc["params"]
        assert "requestState" not in params and "inputResponses" not in params
        used = await opened(w, "alice", urls[0], start=True)
        assert used.status_code == 403
    call = sorted((r for r in records(w) if r["method"] == "tools/call"), key=lambda r: r["ts"])
    assert [r["status"] for r in call] == ["ok", "ok"]
    assert "upstream_not_connected: connect link sent" in (call[0]["note"] or "")


@pytest.mark.skipif(not state_backends.on_redis(),
                    reason="replicas share their live state on Redis (TOLLHOUSE_TEST_STATE)")
async def test_two_replicas_any_one_serves_the_link_once(tmp_path: Path) -> None:
    async with world(tmp_path, replicas=2) as w:
        one, two = w.replicas
        url = await link_for(w, "alice", via=two)  # issued by the second replica
        await follow(w, "alice", url, start_via=two)  # shown by the first, used by the second
        assert (await w.call("alice", via=two)).json()["result"]["content"][0]["text"] == \
            "alice"
        for base in (one, two):
            again = await opened(w, "alice", base + url.removeprefix(w.outer), start=True)
            assert again.status_code == 403
        foreign = await link_for(w, "bob", via=one)
        assert (await opened(w, "alice", two + foreign.removeprefix(w.outer))).status_code \
            == 403
