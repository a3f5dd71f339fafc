"""A virtual endpoint's answers merged from its members': a list (`merged`: every member's
items under the names the endpoint exposes, in the endpoint's order, a name two members would
share kept by the first, an aliased tool the endpoint's rules refuse by its namespaced name
left out, paged with one sealed cursor holding the members' own, `Cursors`), and initialize
or server/discover answered with the members' merged capabilities (`opening`). The names
each list shows are learned on the way (`Exposed.learn`), whatever the caller may see; a
tool's UI resource (MCP Apps) is exposed like the resource (proxy/virtual/uris.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from proxy import __version__
from proxy.chain import CallContext, Chain, Rewrite
from proxy.errors import HiddenTool
from proxy.jsonrpc import McpMessage
from proxy.mcp import bridge, eras, names
from proxy.state import Session
from proxy.virtual import naming, uris
from proxy.virtual.cursor import Cursors
from proxy.virtual.exposed import Exposed, expose
from proxy.virtual.fanout import FanOut
from proxy.virtual.route import VirtualRoute

log = logging.getLogger("tollhouse.virtual")

# list method -> (result key, item field, kind of name)
LISTS = {"tools/list": ("tools", "name", "tool"), "prompts/list": ("prompts", "name", "prompt"),
         "resources/list": ("resources", "uri", "uri"),
         "resources/templates/list": ("resourceTemplates", "uriTemplate", "uri")}
CAPABILITIES = ("tools", "prompts", "resources", "logging", "completions")
LIST_CHANGED = ("tools", "prompts", "resources")  # relayed as the endpoint's own
_NO_POLICIES = Chain(())


class Lists:
    """Merges the members' lists and capabilities for each endpoint."""

    def __init__(self, fan_out: FanOut, exposed: Exposed, cursors: Cursors) -> None:
        self.fan_out = fan_out
        self.exposed = exposed
        self.cursors = cursors
        # told each member's list as it came, before any rule (proxy.seen.LastSeen.listed)
        self.learned: Callable[[str, McpMessage, dict[str, Any]], None] | None = None

    async def merged(self, route: VirtualRoute, msg: McpMessage, cursor: object,
                     ctx: CallContext, chain: Chain, session: Session | None = None
                     ) -> dict[str, Any]:
        """One page of the merged list: the first (`cursor` None) or the one a sealed
        cursor this caller was given names (InvalidParams for any other)."""
        method = msg.method or ""
        key, field, kind = LISTS[method]
        caller = ctx.principal.key
        pending = {m: "" for m in route.members} if cursor is None else \
            self.cursors.open(cursor, route.name, method, caller)
        asks = {}
        for member, member_cursor in pending.items():
            if member not in route.members:
                continue
            asks[member] = request(msg, method, member_cursor or None)
        listed: dict[str, list[str]] = {}  # each member's names, before any rule hides one

        learned = self.learned

        def reader(member: str) -> Rewrite:
            def read(result: dict[str, Any]) -> bool:
                if learned is not None:
                    learned(member, asks[member], result)
                listed[member] = names.listed_names(result, key, field) or []
                return False
            return read

        results = await self.fan_out.ask(route, asks, ctx, chain, session,
                                         None if kind == "uri" and learned is None else reader)
        self.exposed.learn(route, kind, listed)
        items: list[dict[str, Any]] = []
        seen: set[str] = set()
        more: dict[str, str] = {}
        for member in route.members:  # in the endpoint's order, whatever answered first
            result = results.get(member)
            if result is None:
                continue
            for item in result.get(key) or []:
                if not isinstance(item, dict) or not isinstance(item.get(field), str):
                    continue
                original = item[field]
                exposed = expose(route, kind, member, original)
                if exposed in seen:
                    log.warning("/mcp/%s: %s %r of member %s collides with an earlier "
                                "member's: left out", route.name, kind, exposed, member)
                    ctx.audit_note = (ctx.audit_note or "") + \
                        f" left out {kind} {exposed[:80]} of {member} (collision);"
                    continue
                seen.add(exposed)
                if kind == "tool" and exposed in route.aliases and \
                        await self._alias_denied(route, chain, ctx, member, original):
                    continue
                shown = {**item, field: exposed}
                items.append(uris.tool(member, shown) if kind == "tool" else shown)
            nxt = result.get("nextCursor")
            if isinstance(nxt, str) and nxt:
                more[member] = nxt
        out: dict[str, Any] = {key: items}
        if more:
            out["nextCursor"] = self.cursors.seal(route.name, method, caller, more)
        if ctx.era == "modern":  # cached by a 2026-07-28 client: no longer than any member's
            out.update(cache_hints(results.values()))
        return out

    @staticmethod
    async def _alias_denied(route: VirtualRoute, chain: Chain, ctx: CallContext,
                            member: str, tool: str) -> bool:
        """Whether the endpoint's rules refuse an aliased tool by its namespaced name (its
        alias is filtered from the list with every other name, by the spine's rewrite)."""
        namespaced = naming.exposed(member, tool, route.separator)
        call = McpMessage("request", None, "tools/call", {"name": namespaced}, b"")
        try:
            await chain.run(call, ctx, only=("access",))
        except HiddenTool:
            return True
        return False

    async def opening(self, route: VirtualRoute, msg: McpMessage, ctx: CallContext,
                      session: Session | None) -> dict[str, Any]:
        """initialize or server/discover, answered with the members' merged capabilities
        (only what the endpoint can deliver: no subscribe; to a legacy client, list_changed,
        which any member's notice and a change of the members is relayed as)."""
        discover = McpMessage("request", "tollhouse-virtual", "server/discover", {}, b"")
        results = await self.fan_out.ask(route, dict.fromkeys(route.members, discover), ctx,
                                         _NO_POLICIES, session)
        caps: dict[str, Any] = {}
        for result in results.values():
            for key, value in (result.get("capabilities") or {}).items():
                if key in CAPABILITIES and isinstance(value, dict):
                    caps.setdefault(key, {})
        info = {"name": route.name, "version": __version__}
        if msg.method == "initialize":
            for key in LIST_CHANGED:
                if key in caps:
                    caps[key] = {"listChanged": True}
            offered = tasks_offered(results)  # 2025-11-25 tasks: the members' own, merged
            if offered is not None:
                caps["tasks"] = offered
            requested = (msg.params or {}).get("protocolVersion")
            version = requested if requested in eras.LEGACY_VERSIONS else bridge.LEGACY_VERSION
            return {"protocolVersion": version, "capabilities": caps, "serverInfo": info}
        return {"supportedVersions": list(eras.MODERN_VERSIONS), "capabilities": caps,
                "resultType": "complete", "ttlMs": 0, "cacheScope": "private",
                "_meta": {eras.SERVER_INFO: info}}


def tasks_offered(results: Mapping[str, dict[str, Any]]) -> dict[str, Any] | None:
    """The `tasks` capability the members offer, merged (what any member serves: a task
    runs on the member whose tool it is); None when none offers it."""
    merged: dict[str, Any] | None = None
    for result in results.values():
        offered = (result.get("capabilities") or {}).get("tasks")
        if isinstance(offered, dict):
            merged = _union(merged or {}, offered)
    return merged


def _union(into: dict[str, Any], more: dict[str, Any]) -> dict[str, Any]:
    out = dict(into)
    for key, value in more.items():
        if isinstance(value, dict):
            held = out.get(key)
            out[key] = _union(held if isinstance(held, dict) else {}, value)
        elif key not in out:
            out[key] = value
    return out


def cache_hints(results: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """A merged answer's `ttlMs` and `cacheScope` (2026-07-28): the shortest time any member
    gave and the most private scope ("public" only when every member said so); a member that
    gave none is taken as 0 and "private" (what the bridge completes a legacy answer with)."""
    ttl: int | None = None
    public = True
    for result in results:
        given = result.get("ttlMs")
        ms = given if isinstance(given, int) and not isinstance(given, bool) and given > 0 \
            else 0
        ttl = ms if ttl is None else min(ttl, ms)
        public = public and result.get("cacheScope") == "public"
    return {"ttlMs": ttl or 0, "cacheScope": "public" if public and ttl is not None
            else "private"}


def request(msg: McpMessage, method: str, cursor: str | None = None) -> McpMessage:
    """A list request the gateway makes of each member for a client's message (its `_meta`
    kept), with the member's own cursor."""
    params: dict[str, Any] = {}
    meta = (msg.params or {}).get("_meta")
    if isinstance(meta, dict):
        params["_meta"] = meta
    if cursor:
        params["cursor"] = cursor
    return McpMessage("request", msg.id if msg.id is not None else "tollhouse-virtual",
                      method, params, b"")
