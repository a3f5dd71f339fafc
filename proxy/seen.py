"""What the gateway last saw of each upstream server: the tools of the last tools/list answer
it relayed and the protocol version last negotiated with it (`server_tools`, migration 18),
for /api/v1/servers/{name}/status, /api/v1/server-status and the console's servers
pages; and its last prompts/list and resources/list (migration 26), which the endpoints'
server cards show beside the tools (proxy.cards).

It is an `Observer` (proxy.observability): the gateway hands it the results it relays, so no
forwarding code knows of it, and a call that is neither a tools/list, an initialize nor a
server/discover pays one set lookup. The database holds it so that it survives a restart and
reads the same on every replica. A list is written only when it changed: its hash is compared
with the one this process last wrote or read (loaded at start-up), so a tools/list that lists
what it listed before costs no write (each kind of list has its own hash). Writes go to one writer task and run off the event loop,
in the order they were seen; one that fails is logged and retried with the next sighting.
Tools are kept trimmed (`MAX_TOOLS`, names, titles and descriptions cut) before hashing:
what an upstream may send is unbounded, what is stored is not. Each also keeps, for the Cedar
policies validated at start-up (proxy.seen_targets), its boolean hints (readOnlyHint, ...) and
its inputSchema when that is at most `MAX_SCHEMA` bytes of JSON; the API shows name, title and
description only. A per-caller upstream's list is the last caller's. A virtual endpoint's
member lists are kept under the member's name as its fan-out reads them (`listed`), before any
rule hides an item.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from proxy.audit.record import AuditRecord
from proxy.chain import Rewrite
from proxy.jsonrpc import McpMessage
from proxy.mcp import eras
from proxy.storage.db import Database

log = logging.getLogger("tollhouse.seen")

MAX_TOOLS = 500  # of one server's list: the rest is not kept
MAX_NAME = 128
MAX_TITLE = 200
MAX_DESCRIPTION = 300
MAX_VERSION = 32
MAX_URI = 1024  # of a prompt's name or a resource's URI kept
MAX_SCHEMA = 16384  # bytes of a tool's inputSchema as JSON: a larger one is not kept
HINTS = ("destructiveHint", "idempotentHint", "openWorldHint", "readOnlyHint")
SHOWN = ("name", "title", "description")  # what the API shows of a tool kept
# list method -> the kind of list kept (its column), the field naming each item, what is kept
LISTS = {"tools/list": ("tools", "name", SHOWN),
         "prompts/list": ("prompts", "name", SHOWN),
         "resources/list": ("resources", "uri", ("uri", "name", "title", "description",
                                                 "mimeType"))}
KINDS = tuple(kind for kind, _, _ in LISTS.values())
WATCHED = frozenset({*LISTS, "initialize", "server/discover"})
_ERA = ("server", "era", "era_seen_at")
_COLUMNS = {kind: ("server", kind, f"{kind}_hash", f"{kind}_seen_at") for kind in KINDS}


@dataclass(frozen=True, slots=True)
class _Write:
    server: str
    kind: str  # "tools", "prompts", "resources", or "era"
    values: tuple[Any, ...]


def _cut(value: Any, most: int) -> str | None:
    if not isinstance(value, str):
        return None
    return value if len(value) <= most else value[:most - 1] + "…"


def trimmed(tools: list[Any]) -> list[dict[str, Any]]:
    """The tools as kept: name, title and description (cut), the first `MAX_TOOLS` named."""
    kept: list[dict[str, Any]] = []
    for tool in tools:
        if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
            continue
        title = tool.get("title")
        if title is None and isinstance(tool.get("annotations"), dict):
            title = tool["annotations"].get("title")
        entry: dict[str, Any] = {"name": _cut(tool["name"], MAX_NAME),
                                 "title": _cut(title, MAX_TITLE),
                                 "description": _cut(tool.get("description"), MAX_DESCRIPTION)}
        hints = tool.get("annotations")
        if isinstance(hints, dict) and (kept_hints := {
                k: hints[k] for k in HINTS if isinstance(hints.get(k), bool)}):
            entry["annotations"] = kept_hints
        schema = tool.get("inputSchema")
        if isinstance(schema, dict) and _size(schema) <= MAX_SCHEMA:
            entry["inputSchema"] = schema
        kept.append(entry)
        if len(kept) == MAX_TOOLS:
            break
    return kept


def trimmed_items(items: list[Any], field: str, kept: tuple[str, ...]) -> list[dict[str, Any]]:
    """A prompts or resources list as kept: the `kept` text fields of each item (cut), the
    first `MAX_TOOLS`; an item whose name or URI (`field`) is over `MAX_URI` is left out,
    since a cut one would name nothing."""
    out: list[dict[str, Any]] = []
    for item in items:
        key = item.get(field) if isinstance(item, dict) else None
        if not isinstance(key, str) or len(key) > MAX_URI:
            continue
        out.append({k: key if k == field else _cut(
            item.get(k), MAX_DESCRIPTION if k == "description" else MAX_TITLE) for k in kept})
        if len(out) == MAX_TOOLS:
            break
    return out


def _size(value: Any) -> int:
    try:
        return len(orjson.dumps(value))
    except TypeError:  # not JSON (cannot come from a parsed answer): not kept
        return MAX_SCHEMA + 1


def shown(tools: Any) -> Any:
    """The tools as the API shows them: name, title and description of each."""
    if not isinstance(tools, list):
        return tools
    return [{k: t.get(k) for k in SHOWN} if isinstance(t, dict) else t for t in tools]


def _version(msg: McpMessage, result: Mapping[str, Any]) -> str | None:
    """The protocol version an answer settles: initialize's negotiated one; for
    server/discover, the newest both the upstream and the gateway speak."""
    if msg.method == "initialize":
        return _cut(result.get("protocolVersion"), MAX_VERSION)
    offered = result.get("supportedVersions")
    if isinstance(offered, list):
        both = [v for v in offered if isinstance(v, str) and v in eras.MODERN_VERSIONS]
        return max(both) if both else None
    return None


class LastSeen:
    """The observer and its store. `known(name)` says whether an endpoint is an upstream
    server (a virtual endpoint's lists are its members', not a server's)."""

    def __init__(self, database: Database, known: Callable[[str], bool]) -> None:
        self._db = database
        self._known = known
        # (kind, server) -> the hash of its list of that kind as stored
        self._hashes: dict[tuple[str, str], str] = {}
        self._eras: dict[str, str] = {}
        self._queue: asyncio.Queue[_Write | None] | None = None
        self._task: asyncio.Task[None] | None = None
        self._sql = {kind: database.upsert("server_tools", columns, ("server",))
                     for kind, columns in _COLUMNS.items()}
        self._sql["era"] = database.upsert("server_tools", _ERA, ("server",))
        self.writes = 0  # rows written by this process (tests read it)

    # -- the observer ----------------------------------------------------------------------

    def begin(self, record: AuditRecord) -> None:
        pass

    def end(self, record: AuditRecord) -> None:
        pass

    def parsed(self, record: AuditRecord, msg: McpMessage, headers: Mapping[str, str],
               peer: str | None) -> None:
        pass

    def results(self, msg: McpMessage, record: AuditRecord, rewrite: Rewrite | None
                ) -> Rewrite | None:
        if msg.method not in WATCHED or not self._known(record.endpoint):
            return rewrite
        server = record.endpoint

        def seen(result: dict[str, Any]) -> bool:
            # before the policies' rewrite: the list as the upstream gave it
            with contextlib.suppress(Exception):  # never the reason a call fails
                self._saw(server, msg, result)
            return rewrite(result) if rewrite is not None else False

        return seen

    def listed(self, server: str, msg: McpMessage, result: dict[str, Any]) -> None:
        """A list `server` gave that reached no observer as its own: a virtual endpoint's
        member's, as the fan-out read it (before any rule hid an item)."""
        if msg.method in LISTS:
            with contextlib.suppress(Exception):  # never the reason a call fails
                self._saw(server, msg, result)

    def _saw(self, server: str, msg: McpMessage, result: dict[str, Any]) -> None:
        now = time.time()
        listing = LISTS.get(msg.method or "")
        if listing is not None:
            kind, field, kept = listing
            items = result.get(kind)
            if not isinstance(items, list) or result.get("nextCursor") \
                    or (msg.params or {}).get("cursor"):
                return  # one page of several is not the list
            text = orjson.dumps(trimmed(items) if kind == "tools"
                                else trimmed_items(items, field, kept))
            digest = hashlib.sha256(text).hexdigest()
            if self._hashes.get((kind, server)) != digest:
                self._hashes[(kind, server)] = digest
                self._put(_Write(server, kind, (server, text.decode(), digest, now)))
            return
        version = _version(msg, result)
        if version is not None and self._eras.get(server) != version:
            self._eras[server] = version
            self._put(_Write(server, "era", (server, version, now)))

    # -- the store -------------------------------------------------------------------------

    async def start(self) -> None:
        """Read what is stored (so an unchanged list is not written again after a restart),
        then start the writer."""
        for server, era, *digests in await asyncio.to_thread(self._load):
            for kind, digest in zip(KINDS, digests, strict=True):
                if digest is not None:
                    self._hashes[(kind, server)] = digest
            if era is not None:
                self._eras[server] = era
        self._queue = asyncio.Queue()
        self._task = asyncio.get_running_loop().create_task(self._writer())

    def _load(self) -> list[tuple[Any, ...]]:
        with self._db.transaction() as conn:
            return list(conn.execute(
                f"SELECT server, era, {', '.join(f'{k}_hash' for k in KINDS)} FROM server_tools"
            ).fetchall())

    def _put(self, write: _Write) -> None:
        if self._queue is not None:
            self._queue.put_nowait(write)

    async def _writer(self) -> None:
        assert self._queue is not None
        while True:
            write = await self._queue.get()
            try:
                if write is None:
                    return
                await asyncio.to_thread(self._write, write)
                self.writes += 1
            except Exception as exc:  # noqa: BLE001 - the next sighting tries again; the
                # writer lives on, or flush() (every status read) would wait for ever
                log.warning("last seen of server %r not stored: %s", write and write.server,
                            type(exc).__name__)
                if write is not None and write.kind == "era":
                    self._eras.pop(write.server, None)
                elif write is not None:
                    self._hashes.pop((write.kind, write.server), None)
            finally:
                self._queue.task_done()

    def _write(self, write: _Write) -> None:
        with self._db.transaction() as conn:
            conn.execute(self._sql[write.kind], write.values)

    async def flush(self) -> None:
        """Read your own sightings: every one this process made so far is stored."""
        if self._queue is not None:
            await self._queue.join()

    async def get(self, server: str) -> dict[str, Any]:
        """The server's last seen era and tools, as stored (by whichever replica)."""
        return (await self.get_many([server]))[server]

    async def get_many(self, servers: list[str]) -> dict[str, dict[str, Any]]:
        """`get` of each of `servers`, in one read."""
        await self.flush()
        names = list(dict.fromkeys(servers))
        rows = await asyncio.to_thread(self._read, names) if names else []
        out = {name: {"era": None, "era_seen_at": None, "tools": None, "tools_seen_at": None}
               for name in names}
        for server, tools, digest, tools_at, era, era_at in rows:
            if digest is not None:  # another replica's list: compare with that one from now on
                self._hashes[("tools", server)] = digest
            out[server] = {"era": era, "era_seen_at": era_at,
                           "tools": shown(orjson.loads(tools)) if tools is not None else None,
                           "tools_seen_at": tools_at}
        return out

    def _read(self, servers: list[str]) -> list[tuple[Any, ...]]:
        with self._db.transaction() as conn:
            return list(conn.execute(self._db.sql(
                "SELECT server, tools, tools_hash, tools_seen_at, era, era_seen_at FROM "
                f"server_tools WHERE server IN ({', '.join('?' * len(servers))})"),
                tuple(servers)).fetchall())

    async def lists(self, servers: list[str]) -> dict[str, dict[str, list[Any] | None]]:
        """Each server's tools, prompts and resources as last seen (by whichever replica),
        the text fields of each item as kept; None for a kind never seen. Read as stored:
        this process's own sightings may not be written yet."""
        names = list(dict.fromkeys(servers))
        rows = await asyncio.to_thread(self._read_lists, names) if names else []
        out: dict[str, dict[str, list[Any] | None]] = {
            name: dict.fromkeys(KINDS) for name in names}
        for server, *texts in rows:
            for (kind, field, kept), text in zip(LISTS.values(), texts, strict=True):
                listed = orjson.loads(text) if text is not None else None
                out[server][kind] = [{k: i.get(k) for k in kept} for i in listed
                                     if isinstance(i, dict)] \
                    if isinstance(listed, list) else None
        return out

    def _read_lists(self, servers: list[str]) -> list[tuple[Any, ...]]:
        with self._db.transaction() as conn:
            return list(conn.execute(self._db.sql(
                f"SELECT server, {', '.join(KINDS)} FROM server_tools "
                f"WHERE server IN ({', '.join('?' * len(servers))})"),
                tuple(servers)).fetchall())

    async def aclose(self) -> None:
        """What was seen is written, then the writer stops."""
        if self._queue is None or self._task is None:
            return
        self._queue.put_nowait(None)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._task), timeout=5)
        self._task.cancel()
        self._queue = None
