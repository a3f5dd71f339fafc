"""MCP Apps through a virtual endpoint, every place a member's URI reaches the client: an
official-SDK member `up` (the SDK's own Apps extension: a tool bound to a `ui://` resource, a
tool with only the older `ui/resourceUri` key, resource links and embedded resources in a tool
result and in a prompt, a `ui://` template, a `file://` resource) behind /mcp/v, reached by the
official SDK client in both eras. Each URI the client is shown reads back through the
endpoint to the member, with the member's own URI; the access rules and the resource profile
(`resources_allow`) hold for `ui://` resources as for any other (issue 38)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, cast

import pytest
from mcp import Client, MCPError, types
from mcp.client.extension import advertise
from mcp.server.apps import APP_MIME_TYPE, EXTENSION_ID, Apps, client_supports_apps
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.prompts.base import UserMessage

from proxy.audit import query
from proxy.virtual import uris
from proxy.virtual.cursor import Cursors
from proxy.virtual.outgoing import MemberRequests
from tests.e2e.conftest import Stack, open_stack

CLOCK = "<!doctype html><title>clock</title>"
ADMIN = "<!doctype html><title>admin</title>"
AWS_KEY = "AKIAIOSFODNN7EXAMPLE"
MODES = ["legacy", "2026-07-28"]


class Member:
    """The member, and the URIs it was asked to read (its own, never the exposed ones)."""

    def __init__(self) -> None:
        self.reads: list[str] = []
        apps = Apps()

        @apps.tool(resource_uri="ui://clock/app.html", description="The time, with a UI")
        def get_time() -> str:
            return "12:00"

        apps.add_html_resource("ui://clock/app.html", CLOCK)
        apps.add_html_resource("ui://admin/panel.html", ADMIN)
        server = self.server = MCPServer("clock", extensions=[apps])

        @server.tool(meta={"ui/resourceUri": "ui://clock/app.html"})
        def old_clock() -> str:
            """Bound to its UI by the older flat key only."""
            return "12:00"

        @server.tool()
        def linked() -> types.CallToolResult:
            """Resource links, an embedded resource, and the UI in the result's _meta."""
            return types.CallToolResult(
                content=[types.ResourceLink(type="resource_link", uri="ui://clock/app.html",
                                            name="clock", mime_type=APP_MIME_TYPE),
                         types.ResourceLink(type="resource_link", uri="file:///notes.txt",
                                            name="notes"),
                         types.EmbeddedResource(type="resource", resource=types.
                                                TextResourceContents(
                                                    uri="ui://widgets/9", text=f"key {AWS_KEY}",
                                                    mime_type=APP_MIME_TYPE)),
                         types.TextContent(type="text", text="see ui://clock/app.html")],
                meta={"ui": {"resourceUri": "ui://clock/app.html"}})

        @server.tool()
        def renders_apps(ctx: Context) -> str:
            """Whether the client declared it renders MCP Apps (as a member sees it)."""
            return str(client_supports_apps(ctx))

        @server.resource("file:///notes.txt")
        def notes() -> str:
            self.reads.append("file:///notes.txt")
            return "notes"

        @server.resource("ui://widgets/{wid}", mime_type=APP_MIME_TYPE)
        def widget(wid: str) -> str:
            self.reads.append(f"ui://widgets/{wid}")
            return f"<p>widget {wid}</p>"

        @server.prompt()
        def show() -> list[UserMessage]:
            """A prompt that embeds the UI."""
            return [UserMessage(types.EmbeddedResource(type="resource", resource=types.
                                                       TextResourceContents(
                                                           uri="ui://clock/app.html", text=CLOCK,
                                                           mime_type=APP_MIME_TYPE)))]

    def app(self) -> Any:
        return self.server.streamable_http_app(streamable_http_path="/mcp")


@asynccontextmanager
async def gateway(tmp_path: Path, member: Member, endpoint: dict[str, Any] | None = None,
                  upstream: dict[str, Any] | None = None, **config: Any
                  ) -> AsyncIterator[tuple[Stack, str]]:
    """The gateway with `up` (`upstream` its settings) as the one member of /mcp/v."""
    tables = {"endpoints": [{"name": "v", "members": ["up"], **(endpoint or {})}], **config}
    async with open_stack(tmp_path, lambda: (member.app(), None), config=tables,
                          screening={"mode": "off"}, **(upstream or {})) as stack:
        yield stack, f"{stack.gateway_url}/mcp/v"


def text_of(result: types.ReadResourceResult) -> str:
    (content,) = result.contents
    assert isinstance(content, types.TextResourceContents)
    return content.text


@pytest.mark.parametrize("mode", MODES)
async def test_tools_and_resources_name_the_same_ui_uri(tmp_path: Path, mode: str) -> None:
    member = Member()
    async with gateway(tmp_path, member) as (_, url), Client(url, mode=mode) as client:
        tools = {t.name: t.meta or {} for t in (await client.list_tools()).tools}
        assert tools["up__get_time"]["ui"]["resourceUri"] == "ui://up/clock/app.html"
        assert tools["up__old_clock"]["ui/resourceUri"] == "ui://up/clock/app.html"
        assert "ui" not in tools["up__old_clock"]  # nothing added that the member did not say
        listed = {r.uri: r for r in (await client.list_resources()).resources}
        assert set(listed) == {"ui://up/clock/app.html", "ui://up/admin/panel.html",
                               "tollhouse://up/file:///notes.txt"}  # other schemes as before
        assert listed["ui://up/clock/app.html"].mime_type == APP_MIME_TYPE
        templates = (await client.list_resource_templates()).resource_templates
        assert [t.uri_template for t in templates] == ["ui://up/widgets/{wid}"]
        for uri, text in [("ui://up/clock/app.html", CLOCK), ("ui://up/widgets/7", "widget 7"),
                          ("tollhouse://up/file:///notes.txt", "notes")]:
            read = await client.read_resource(uri)
            assert read.contents[0].uri == uri  # as the client asked for it
            assert text in text_of(read)
    assert member.reads == ["ui://widgets/7", "file:///notes.txt"]  # the member's own URIs


@pytest.mark.parametrize("mode", MODES)
async def test_links_and_embedded_resources_in_results_read_back(tmp_path: Path,
                                                                 mode: str) -> None:
    """A tool result's resource links, embedded resource and `_meta` UI, and a prompt's
    embedded resource, name the URIs the endpoint serves; a guardrail still reads the
    member's result (the embedded resource's text redacted) before the URIs are exposed."""
    member = Member()
    rules = {"guardrails": [{"name": "keys", "tools": ["linked"], "detect": ["secrets"],
                             "action": "redact"}]}
    async with gateway(tmp_path, member, **rules) as (_, url), \
            Client(url, mode=mode) as client:
        result = await client.call_tool("up__linked", {})
        assert not result.is_error
        clock, notes, embedded, text = result.content
        assert isinstance(clock, types.ResourceLink) and isinstance(notes, types.ResourceLink)
        assert (clock.uri, notes.uri) == ("ui://up/clock/app.html",
                                          "tollhouse://up/file:///notes.txt")
        assert isinstance(embedded, types.EmbeddedResource)
        assert embedded.resource.uri == "ui://up/widgets/9"
        assert isinstance(embedded.resource, types.TextResourceContents)
        assert embedded.resource.text == "key [REDACTED:secret]"
        assert isinstance(text, types.TextContent)
        assert text.text == "see ui://clock/app.html"  # text is the member's: not rewritten
        assert (result.meta or {})["ui"]["resourceUri"] == "ui://up/clock/app.html"
        assert CLOCK in text_of(await client.read_resource(clock.uri))
        assert text_of(await client.read_resource(notes.uri)) == "notes"
        assert "widget 9" in text_of(await client.read_resource(embedded.resource.uri))
        prompt = await client.get_prompt("up__show")
        (message,) = prompt.messages
        assert isinstance(message.content, types.EmbeddedResource)
        assert message.content.resource.uri == "ui://up/clock/app.html"


@pytest.mark.parametrize("mode", MODES)
async def test_access_rules_and_profiles_hold_for_ui_resources(tmp_path: Path,
                                                               mode: str) -> None:
    """The endpoint's rule by the exposed URI and the member's own rule by its own URI each
    hide a `ui://` resource from the list and refuse its read as one that does not exist; an
    allowlist (the resource profile) hides what it does not name. None reaches the member."""
    member = Member()
    endpoint = {"access": {"resources_deny": ["ui://up/admin/*"]}}
    upstream = {"access": {"resources_deny": ["ui://widgets/*"]}}
    async with gateway(tmp_path, member, endpoint, upstream) as (stack, url), \
            Client(url, mode=mode) as client:
        listed = {r.uri for r in (await client.list_resources()).resources}
        assert listed == {"ui://up/clock/app.html", "tollhouse://up/file:///notes.txt"}
        assert (await client.list_resource_templates()).resource_templates == []
        for hidden in ("ui://up/admin/panel.html", "ui://up/widgets/7"):
            with pytest.raises(MCPError) as caught:
                await client.read_resource(hidden)
            assert (caught.value.error.code, caught.value.error.message) == \
                (-32602, f"Resource not found: {hidden}")
        assert CLOCK in text_of(await client.read_resource("ui://up/clock/app.html"))
    assert member.reads == []
    reads = [r for r in query(stack.db_path, limit=100) if r["method"] == "resources/read"]
    denied = sorted(r["denied_reason"] for r in reads if r["status"] == "denied")
    assert denied == [  # the endpoint's rule on the exposed URI, the member's on its own
        "access: resource ui://up/admin/panel.html matches deny pattern 'ui://up/admin/*'",
        "access: resource ui://widgets/7 matches deny pattern 'ui://widgets/*'"], reads


async def test_a_resource_allowlist_holds_for_ui_resources(tmp_path: Path) -> None:
    member = Member()
    endpoint = {"access": {"resources_allow": ["ui://up/clock/*"]}}
    async with gateway(tmp_path, member, endpoint) as (_, url), \
            Client(url, mode="2026-07-28") as client:
        listed = {r.uri for r in (await client.list_resources()).resources}
        assert listed == {"ui://up/clock/app.html"}
        for hidden in ("ui://up/admin/panel.html", "tollhouse://up/file:///notes.txt"):
            with pytest.raises(MCPError) as caught:
                await client.read_resource(hidden)
            assert caught.value.error.message == f"Resource not found: {hidden}"
        assert CLOCK in text_of(await client.read_resource("ui://up/clock/app.html"))
    assert member.reads == []


@pytest.mark.parametrize(("mode", "member_era", "seen"), [
    ("legacy", "legacy", "True"), ("legacy", "auto", "True"), ("2026-07-28", "auto", "True"),
    # a 2026-07-28 caller's legacy member session is held per caller, declaring nothing
    ("2026-07-28", "legacy", "False")])
async def test_a_member_sees_that_the_client_renders_apps(tmp_path: Path, mode: str,
                                                          member_era: str, seen: str) -> None:
    """The client's MCP Apps declaration reaches the member, so a tool that offers its UI
    only to a client that renders it (`client_supports_apps`) does through the endpoint."""
    member = Member()
    ui = advertise(EXTENSION_ID, {"mimeTypes": [APP_MIME_TYPE]})
    async with gateway(tmp_path, member, upstream={"era": member_era}) as (_, url):
        async with Client(url, mode=mode, extensions=[ui]) as client:
            result = await client.call_tool("up__renders_apps", {})
            assert isinstance(result.content[0], types.TextContent)
            assert result.content[0].text == seen
        async with Client(url, mode=mode) as client:  # one that does not: told so
            result = await client.call_tool("up__renders_apps", {})
            assert isinstance(result.content[0], types.TextContent)
            assert result.content[0].text == "False"


def test_a_members_resource_update_names_the_exposed_uri() -> None:
    requests = MemberRequests(cast(Any, None), Cursors(b"k"), cast(Any, None))
    notice = {"jsonrpc": "2.0", "method": "notifications/resources/updated",
              "params": {"uri": "ui://clock/app.html"}}
    assert requests.view("v", "up", "caller c", notice)
    assert notice["params"] == {"uri": "ui://up/clock/app.html"}


def test_malformed_results_pass_unchanged() -> None:
    """What is not the shape the spec gives is left as the member sent it, never an error."""
    for method, result in [
            ("tools/call", {"content": [None, "x", {"type": "resource_link", "uri": 7},
                                        {"type": "resource", "resource": "x"}],
                            "_meta": {"ui": "x", "ui/resourceUri": None}}),
            ("tools/call", {"content": "x", "_meta": []}),
            ("resources/read", {"contents": [{"uri": None}, 3]}),
            ("resources/read", {"contents": {"uri": "ui://x/y"}}),
            ("prompts/get", {"messages": [{"content": None}, None]}),
            ("prompts/get", {"messages": "x"})]:
        shown = uris.shown("up", method)
        assert shown is not None
        before = repr(result)
        assert not shown(result)
        assert repr(result) == before
    assert uris.shown("up", "tools/list") is None
    item = {"name": "t", "_meta": {"ui": {"resourceUri": None}}}
    assert uris.tool("up", item) is item
