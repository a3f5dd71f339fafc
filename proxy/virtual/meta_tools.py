"""Tool search on a virtual endpoint (`[endpoints.search] mode = "search"`, docs/virtual-
endpoints.md): its tools/list shows two meta-tools, `search_tools` and `call_tool`, and the
`always` tools, in place of every member's tools.

No second path around the rules. `call_tool` is taken apart before the policy chain runs
(`unwrapped`, called by the spine right after the message's era checks): from then on it is the
`tools/call` of the tool it names, with its arguments, so access rules, tool profiles, Cedar,
rate limits, guardrails, approvals, metering and the audit see the real tool exactly as when it
is called by name (a hidden tool's name answers as an unknown one does); the record says it came
through search (`McpMessage.via`). `search_tools` is checked as the list it reads (`check`: the
endpoint's rules for a tools/list) and reads the list as this caller's tools/list would show it
(`visible`: every member's page, each member's rules and rewriters, then the endpoint's), then
ranks that list (proxy/virtual/search.py: one BM25 index per distinct list, not per search).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson

from proxy.chain import CallContext, Chain, Rewrite
from proxy.errors import InvalidParams
from proxy.jsonrpc import McpMessage
from proxy.mcp.legs import Leg
from proxy.state import Session
from proxy.virtual.lists import Lists, request
from proxy.virtual.route import VirtualRoute
from proxy.virtual.search import Indexes

if TYPE_CHECKING:
    from proxy.audit import AuditRecord

SEARCH = "search_tools"
CALL = "call_tool"
VIA = "search"
MAX_PAGES = 100  # pages of the merged list a search reads at most (each member's pages)

SEARCH_TOOL: dict[str, Any] = {
    "name": SEARCH,
    "title": "Search tools",
    "description": (
        "Find the tools that can do a task. Describe the task in a few words; the answer "
        "lists the best-matching tools with their full definitions (name, description, "
        "input schema). Then run one with call_tool."),
    "inputSchema": {
        "type": "object",
        "properties": {
            "query": {"type": "string", "description": "The task, in a few words."},
            "limit": {"type": "integer", "minimum": 1,
                      "description": "How many tools to answer at most."},
        },
        "required": ["query"],
    },
    "annotations": {"readOnlyHint": True, "idempotentHint": True, "openWorldHint": False},
}
CALL_TOOL: dict[str, Any] = {
    "name": CALL,
    "title": "Call a tool",
    "description": (
        "Run a tool that search_tools found, by its name, with its arguments (an object "
        "that follows the tool's input schema). Answers what the tool answers."),
    "inputSchema": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "description": "The tool's name, as search_tools "
                                                      "gave it."},
            "arguments": {"type": "object", "description": "The tool's arguments."},
        },
        "required": ["name"],
    },
}


def unwrapped(route: object, msg: McpMessage, record: AuditRecord) -> McpMessage:
    """A `call_tool` request on an endpoint in search mode, as the `tools/call` it asks for
    (its `_meta` and any other params kept), its record naming the real tool; any other
    message as it is."""
    if msg.method != "tools/call" or msg.kind != "request" or msg.tool != CALL \
            or not isinstance(route, VirtualRoute) or not route.searched:
        return msg
    params = msg.params or {}
    given = params.get("arguments")
    given = {} if given is None else given
    name = given.get("name") if isinstance(given, dict) else None
    arguments = given.get("arguments", {}) if isinstance(given, dict) else None
    if not isinstance(name, str) or not isinstance(arguments, dict):
        raise InvalidParams("Invalid params: call_tool takes arguments {\"name\": a tool's "
                            "name, \"arguments\": an object}")
    called = {**params, "name": name, "arguments": arguments}
    body = orjson.dumps({"jsonrpc": "2.0", "id": msg.id, "method": "tools/call",
                         "params": called})
    record.tool = name
    record.note = f"via {VIA} ({CALL})"
    return McpMessage(msg.kind, msg.id, msg.method, called, body, via=VIA)


class ToolSearch:
    """What a virtual endpoint in search mode answers itself: its tools/list and
    `search_tools`."""

    def __init__(self, lists: Lists, indexes: Indexes | None = None) -> None:
        self.lists = lists
        self.indexes = indexes or Indexes()

    @staticmethod
    def searching(route: VirtualRoute, msg: McpMessage) -> bool:
        """A `search_tools` call on an endpoint in search mode."""
        return route.searched and msg.method == "tools/call" and msg.tool == SEARCH \
            and msg.kind == "request"

    def answers(self, route: VirtualRoute, msg: McpMessage) -> bool:
        """Whether the answer is given here: a search, or the endpoint's tools/list."""
        return route.searched and (msg.method == "tools/list" or self.searching(route, msg))

    async def check(self, route: VirtualRoute, chain: Chain, msg: McpMessage,
                    ctx: CallContext) -> CallContext:
        """A search is decided as the list it reads: the endpoint's rules for a tools/list
        (its callers, rate limits); each member's are applied as the list is read."""
        ctx.virtual = True
        await chain.run(request(msg, "tools/list"), ctx, without=("egress",))
        return ctx

    async def call(self, route: VirtualRoute, msg: McpMessage, ctx: CallContext, chain: Chain,
                   session: Session | None) -> Leg:
        modern = ctx.era == "modern"
        if msg.method == "tools/list":
            if (msg.params or {}).get("cursor") is not None:
                raise InvalidParams("Invalid cursor")  # this list is never paged
            tools, extra = await self._merged(route, msg, ctx, chain, session)
            leg = Leg([], local={**extra, "tools": tools}, bridged=modern)
            leg.shown = _listed(route)  # after the policies' rewrite: what they left
            return leg
        query, limit = _arguments(route, msg)
        tools = await self.visible(route, msg, ctx, chain, session)
        found = (await self.indexes.of(route.name, tools)).search(query, limit)
        text = orjson.dumps({"tools": found}).decode()
        return Leg([], local={"content": [{"type": "text", "text": text}],
                              "structuredContent": {"tools": found}, "isError": False},
                   bridged=modern)

    async def visible(self, route: VirtualRoute, msg: McpMessage, ctx: CallContext,
                      chain: Chain, session: Session | None) -> list[dict[str, Any]]:
        """The tools this caller's tools/list would show, every page, after every rule."""
        listing = request(msg, "tools/list")
        tools, extra = await self._merged(route, listing, ctx, chain, session)
        result = {**extra, "tools": tools}
        rewrite = chain.rewriter(listing, ctx)  # the endpoint's own, as the spine applies
        if rewrite is not None:
            rewrite(result)
        kept = result.get("tools")
        return kept if isinstance(kept, list) else []

    async def _merged(self, route: VirtualRoute, msg: McpMessage, ctx: CallContext,
                      chain: Chain, session: Session | None
                      ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """Every page of the members' merged tools (each member's rules applied), and the
        first page's other fields (its cache hints)."""
        listing = request(msg, "tools/list")
        tools: list[dict[str, Any]] = []
        extra: dict[str, Any] = {}
        cursor: str | None = None
        for _ in range(MAX_PAGES):
            page = await self.lists.merged(route, listing, cursor, ctx, chain, session)
            tools.extend(page.get("tools") or [])
            if not extra:
                extra = {k: v for k, v in page.items() if k not in ("tools", "nextCursor")}
            nxt = page.get("nextCursor")
            if not isinstance(nxt, str) or not nxt:
                break
            cursor = nxt
        return tools, extra


def _arguments(route: VirtualRoute, msg: McpMessage) -> tuple[str, int]:
    """`search_tools`'s query and limit (capped at the endpoint's max_results)."""
    given = (msg.params or {}).get("arguments")
    given = {} if given is None else given
    query = given.get("query") if isinstance(given, dict) else None
    if not isinstance(query, str) or not query.strip():
        raise InvalidParams("Invalid params: search_tools takes arguments {\"query\": the "
                            "task, in words}")
    limit = given.get("limit", route.search.max_results)
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
        raise InvalidParams("Invalid params: search_tools' limit must be a whole number of "
                            "at least 1")
    return query, min(limit, route.search.max_results)


def _listed(route: VirtualRoute) -> Rewrite:
    """The search-mode list: the meta-tools, then the `always` tools the caller may see, in
    the order the endpoint names them."""
    always = route.search.always

    def listed(result: dict[str, Any]) -> bool:
        shown = {t.get("name"): t for t in result.get("tools") or [] if isinstance(t, dict)}
        result["tools"] = [SEARCH_TOOL, CALL_TOOL,
                           *(shown[name] for name in always if name in shown)]
        return True

    return listed
