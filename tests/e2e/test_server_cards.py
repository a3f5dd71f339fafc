"""Server cards (SEP-2127) end to end: official-SDK upstreams behind a plain and a virtual
endpoint, the official SDK client listing through the gateway, and the cards and the catalog
read over HTTP: a card lists what that caller's own list shows (access rules and group tool
profiles hiding tools, prompts and resources), an anonymous caller sees nothing on an endpoint
that requires a credential, a bad credential answers as the MCP edge does, and no card request
reaches an upstream."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
from mcp import Client
from mcp.server.mcpserver import MCPServer

from proxy.cards import CARD_TYPE, SCHEMA
from proxy.mcp import eras
from tests.e2e.sdk_client import connect
from tests.e2e.upstreams import ASGIApp
from tests.helpers import jwt_auth, token
from tests.policies.cedar.test_gateway import Bank
from tests.policies.cedar.test_gateway import gateway as cedar_gateway
from tests.stack import Site, gateway_stack

CARD_FIELDS = {"$schema", "name", "version", "description", "title", "websiteUrl",
               "repository", "icons", "remotes", "_meta"}  # the v2 schema's, and no other


class Counted:
    """An upstream app that counts the HTTP requests it is sent."""

    def __init__(self, app: ASGIApp) -> None:
        self.app, self.requests = app, 0

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            self.requests += 1
        await self.app(scope, receive, send)


def files_app() -> Counted:
    server = MCPServer("files", version="2.0.0")

    @server.tool()
    async def read_file(path: str) -> str:
        """Read a file."""
        return path

    @server.tool()
    async def delete_file(path: str) -> str:
        """Delete a file."""
        return path

    @server.tool()
    async def search(query: str) -> str:
        """Search the files."""
        return query

    @server.prompt()
    def summarize(path: str) -> str:
        """Summarize a file."""
        return f"summarize {path}"

    @server.prompt()
    def internal_plan() -> str:
        return "plan"

    @server.resource("file:///notes.txt", name="notes", description="The notes")
    def notes() -> str:
        return "notes"

    @server.resource("file:///secret/key", name="key")
    def key() -> str:
        return "key"

    return Counted(server.streamable_http_app(streamable_http_path="/mcp", json_response=True,
                                              stateless_http=True))


def clock_app() -> Counted:
    server = MCPServer("clock", version="1.0.0")

    @server.tool()
    async def now() -> str:
        """The time now."""
        return "noon"

    @server.tool()
    async def timezone() -> str:
        return "UTC"

    return Counted(server.streamable_http_app(streamable_http_path="/mcp", json_response=True,
                                              stateless_http=True))


def bearer(site: Site, endpoint: str, sub: str, groups: list[str]) -> dict[str, str]:
    """A token for `endpoint` at the gateway's public URL (the stack's own)."""
    jwt = token(aud=site.endpoint(endpoint), sub=sub, groups=groups)
    return {"Authorization": f"Bearer {jwt}"}


@asynccontextmanager
async def stack(auth: dict[str, Any]) -> AsyncIterator[tuple[Site, Counted, Counted]]:
    files, clock = files_app(), clock_app()
    files_access = {"tools_allow": ["read_*", "search"], "prompts_deny": ["internal_*"],
                    "resources_deny": ["file:///secret/*"],
                    "group_tools": {"ops": {"tools_allow": ["delete_*"]}}}
    async with gateway_stack(lambda urls: {
            "server": {"public_url": urls.gateway}, "auth": auth,
            "upstreams": [{"name": "files", "url": f"{urls.upstreams['files']}/mcp",
                           "access": files_access},
                          {"name": "clock", "url": f"{urls.upstreams['clock']}/mcp"}],
            "endpoints": [{"name": "team", "members": ["files", "clock"],
                           "access": {"tools_deny": ["clock__timezone"]}}]},
            upstreams={"files": files, "clock": clock}) as site:
        yield site, files, clock


def primitives(card: dict[str, Any]) -> dict[str, Any]:
    listed: dict[str, Any] = card["_meta"]["tollhouse/primitives"]
    return listed


def names(card: dict[str, Any], kind: str, field: str = "name") -> set[str] | None:
    items = primitives(card)[kind]
    return None if items is None else {i[field] for i in items}


async def card(site: Site, endpoint: str, headers: dict[str, str] | None = None
               ) -> dict[str, Any]:
    answer = await site.client.get(f"/mcp/{endpoint}/server-card",
                                   headers={"Accept": CARD_TYPE, **(headers or {})})
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"] == CARD_TYPE
    assert answer.headers["access-control-allow-origin"] == "*"
    got: dict[str, Any] = answer.json()
    return got


async def test_a_card_lists_what_that_caller_could_list() -> None:
    async with stack(jwt_auth()) as (site, _, _):
        alice = bearer(site, "files", "alice", ["eng"])
        olga = bearer(site, "files", "olga", ["ops"])
        before = await card(site, "files", alice)
        assert primitives(before) == {"viewer": "caller", "tools": None, "prompts": None,
                                      "resources": None}  # never listed yet
        async with connect(site.endpoint("files"), headers=alice) as client:
            listed = {t.name for t in (await client.list_tools()).tools}
            prompts = {p.name for p in (await client.list_prompts()).prompts}
            resources = {str(r.uri) for r in (await client.list_resources()).resources}
        assert listed == {"read_file", "search"} and prompts == {"summarize"}
        assert resources == {"file:///notes.txt"}
        seen = await card(site, "files", alice)
        assert names(seen, "tools") == listed and names(seen, "prompts") == prompts
        assert names(seen, "resources", "uri") == resources
        read_file = next(t for t in primitives(seen)["tools"] if t["name"] == "read_file")
        assert read_file["description"] == "Read a file."
        async with connect(site.endpoint("files"), headers=olga) as client:
            olgas = {t.name for t in (await client.list_tools()).tools}
        assert olgas == {"read_file", "search", "delete_file"}  # her group's profile
        assert names(await card(site, "files", olga), "tools") == olgas

        # the card itself: the SEP's fields, the endpoint's URL, versions and authorization
        assert set(seen) <= CARD_FIELDS and seen["$schema"] == SCHEMA
        assert seen["name"] == "1.0.0.127/files" or seen["name"].endswith("/files")
        (remote,) = seen["remotes"]
        assert remote["type"] == "streamable-http" and remote["url"] == site.endpoint("files")
        assert set(remote["supportedProtocolVersions"]) >= {"2025-11-25", "2026-07-28"}
        assert set(remote["supportedProtocolVersions"]) <= eras.KNOWN_VERSIONS
        assert [h["name"] for h in remote["headers"]] == ["Authorization"]
        authorization = seen["_meta"]["tollhouse/authorization"]
        assert authorization["required"] is True
        metadata = await site.client.get(authorization["protectedResourceMetadata"])
        assert metadata.status_code == 200
        assert metadata.json()["resource"] == site.endpoint("files")


async def test_an_anonymous_caller_and_a_bad_credential() -> None:
    async with stack(jwt_auth()) as (site, _, _):
        alice = bearer(site, "files", "alice", ["eng"])
        async with connect(site.endpoint("files"), headers=alice) as client:
            await client.list_tools()
        anonymous = await site.client.get("/mcp/files/server-card")
        assert anonymous.status_code == 200
        assert primitives(anonymous.json()) == {"viewer": "anonymous", "tools": [],
                                                "prompts": [], "resources": []}
        assert anonymous.headers["cache-control"].startswith("public")
        assert anonymous.headers["vary"] == "Authorization"
        own = await site.client.get("/mcp/files/server-card", headers=alice)
        assert own.headers["cache-control"].startswith("private")
        # a credential that does not hold answers as the MCP edge answers it
        for bad in ("Bearer not-a-token", bearer(site, "clock", "alice", [])["Authorization"]):
            refused = await site.client.get("/mcp/files/server-card",
                                            headers={"Authorization": bad})
            assert refused.status_code == 401, refused.text
            assert refused.json()["error"]["message"] == "Unauthorized"
            assert "resource_metadata=" in refused.headers["www-authenticate"]
            assert "invalid_token" in refused.headers["www-authenticate"]


async def test_a_virtual_endpoints_card_and_the_catalog() -> None:
    async with stack(jwt_auth()) as (site, files, clock):
        alice = bearer(site, "team", "alice", ["eng"])
        async with connect(site.endpoint("team"), headers=alice) as client:
            listed = {t.name for t in (await client.list_tools()).tools}
            prompts = {p.name for p in (await client.list_prompts()).prompts}
            resources = {str(r.uri) for r in (await client.list_resources()).resources}
        assert listed == {"files__read_file", "files__search", "clock__now"}
        team = await card(site, "team", alice)
        assert names(team, "tools") == listed and names(team, "prompts") == prompts
        assert names(team, "resources", "uri") == resources and len(resources) == 1
        # the members' lists were kept as the endpoint's fan-out read them: clock was never
        # listed on its own endpoint
        clock_card = await card(site, "clock", bearer(site, "clock", "alice", ["eng"]))
        assert names(clock_card, "tools") == {"now", "timezone"}
        upstream_requests = files.requests + clock.requests
        assert upstream_requests > 0

        catalog = await site.client.get("/.well-known/mcp/catalog.json")
        assert catalog.status_code == 200 and catalog.headers["access-control-allow-origin"] == "*"
        entries = catalog.json()["entries"]
        assert catalog.json()["specVersion"] == "draft"
        assert {e["displayName"] for e in entries} == {"files", "clock", "team"}
        for entry in entries:
            assert entry["type"] == CARD_TYPE
            assert entry["url"] == f"{site.endpoint(entry['displayName'])}/server-card"
            got = await site.client.get(entry["url"])
            assert got.status_code == 200 and got.json()["title"] == entry["displayName"]

        # cached: the same card again is 304 for its ETag; an unknown endpoint is 404
        first = await site.client.get("/mcp/team/server-card", headers=alice)
        again = await site.client.get("/mcp/team/server-card",
                                      headers={**alice, "If-None-Match": first.headers["etag"]})
        assert again.status_code == 304 and again.content == b""
        assert again.headers["etag"] == first.headers["etag"]
        for path in ("/mcp/nope/server-card", "/mcp/nope/server-card?x=1"):
            missing = await site.client.get(path, headers=alice)
            assert (missing.status_code, missing.json()) == (404, {"error": "not found"})
        assert files.requests + clock.requests == upstream_requests  # no card reached one


async def test_without_authentication_an_anonymous_caller_sees_what_it_could_list() -> None:
    async with stack({"mode": "none"}) as (site, _, _):
        async with connect(site.endpoint("files")) as client:
            listed = {t.name for t in (await client.list_tools()).tools}
        got = await card(site, "files")
        assert primitives(got)["viewer"] == "anonymous"
        assert names(got, "tools") == listed == {"read_file", "search"}
        assert got["_meta"]["tollhouse/authorization"] == {"required": False}
        assert "headers" not in got["remotes"][0]


async def test_cedar_policies_hide_from_a_card_what_they_hide_from_a_list(
        tmp_path: Path) -> None:
    """A tool no call of which a Cedar policy could permit is neither listed nor on the card,
    on the plain endpoint and on a virtual one (by its member's policies)."""
    async with cedar_gateway(tmp_path, Bank()) as stack:
        http = httpx.AsyncClient(base_url=stack.gateway_url)
        for endpoint in ("up", "v"):
            async with Client(f"{stack.gateway_url}/mcp/{endpoint}") as client:
                listed = {t.name for t in (await client.list_tools()).tools}
            got = (await http.get(f"/mcp/{endpoint}/server-card")).json()
            assert names(got, "tools") == listed
            assert listed in ({"balance", "transfer"}, {"up__balance", "up__transfer"})
        await http.aclose()


async def test_a_per_caller_upstream_lists_nothing_on_its_card(tmp_path: Path) -> None:
    """Each caller of a per-caller upstream has an upstream of their own: the list one of
    them saw says nothing of another's, so its card lists no primitives."""
    files = files_app()
    async with gateway_stack(lambda urls: {
            "server": {"public_url": urls.gateway}, "auth": jwt_auth(),
            "upstreams": [{"name": "mine", "url": f"{urls.upstreams['files']}/{{tenant}}",
                           "placeholders": {"tenant": {}}}]},
            upstreams={"files": files}) as site:
        got = await card(site, "mine", bearer(site, "mine", "alice", []))
        assert primitives(got) == {"viewer": "caller", "tools": None, "prompts": None,
                                   "resources": None}
