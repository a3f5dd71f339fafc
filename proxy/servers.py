"""The live server table the MCP edge and the management API share: the upstream servers the
config file declares (read-only, `source: config`) and those created through the API (stored,
`source: api`). A change takes effect on the next request: the edge's route table is swapped
entry by entry, so a call in flight keeps the route it started with. Servers registered through
the API may be dialled only in the zones they name (default `remote`), checked by the egress
policy like every other upstream. Several gateways on one database share the registry (see
`Registry`)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from typing import Any

import orjson
from pydantic import ValidationError

from proxy.config import Config, UpstreamConfig, validate_upstream_egress
from proxy.destinations import Destination, UpstreamEgress
from proxy.errors import ApiError, BadRequest, Conflict, Invalid, NotFound
from proxy.mirror import Mirrors
from proxy.published import Published
from proxy.storage import db
from proxy.storage.stored import StoredSpecs
from proxy.strict import ServerIn, ServerOut
from proxy.upstream import UpstreamRoute

log = logging.getLogger("tollhouse.registry")


class Registry:
    """The servers, in memory for the edge, in the database for every gateway on it. Writes go
    to the database first (one transaction each, the row's change and its check together) and
    are applied here only once committed; the table is a mirror (proxy.mirror) every gateway
    polls, and the API's own routes `sync` first, so a change made through any gateway's API
    reaches this one's edge within the mirrors' `poll_s` and its API at once. What the policies
    read of the servers (their access rules, their egress destinations) is published whole
    (proxy.published) in `access` and `destinations`."""

    def __init__(self, cfg: Config, routes: dict[str, UpstreamRoute], mirrors: Mirrors,
                 access: Published[Any], destinations: Published[Destination],
                 database: db.Target | None = None, *,
                 reserved: Callable[[str], bool] = lambda name: False,
                 changed: Callable[[], None] | None = None) -> None:
        self._public_url = cfg.server.public_url.rstrip("/")
        self._config = {u.name: u for u in cfg.upstreams}
        self._routes = routes
        self._access = access
        self._destinations = destinations
        self._database = db.resolve(cfg.database.url if database is None else database)
        self._rows = StoredSpecs(self._database, "servers", ServerIn, "server")
        self._api: dict[str, ServerIn] = {}
        self.reserved = reserved  # names served otherwise (the virtual endpoints')
        self.changed = changed  # told after each change is applied
        self._mirror = mirrors.mirror(
            "server registry", self._rows.read_version,
            lambda: self._rows.read_all(lambda name: name in self._config), self._apply,
            errors=self._database.errors)
        self._apply(self._mirror.load_now())

    def changing(self) -> contextlib.AbstractAsyncContextManager[None]:
        """Held while a reload swaps the config's servers (`rebase`), so no write of the API
        lands in between."""
        return self._mirror.changing()

    def rebase(self, cfg: Config) -> None:
        """A reload: the config's servers are now `cfg`'s (their routes already in place). One
        of the API the file now names is the file's; one it no longer names is read from the
        database at the next `sync`. Called inside `changing()`."""
        self._config = {u.name: u for u in cfg.upstreams}
        for name in [n for n in self._api if n in self._config]:
            del self._api[name]  # the file's now: its route is in place
        self._published()
        self._mirror.stale()

    # -- reading -------------------------------------------------------------------------------

    def _apply(self, servers: dict[str, ServerIn]) -> None:
        """Make the edge serve exactly `servers` (beside the config's)."""
        for name in [n for n in self._api if n not in servers]:
            del self._api[name]
            self._routes.pop(name, None)
        for name, server in servers.items():
            if self._api.get(name) != server:
                try:
                    self._install(server)
                except ValueError as exc:  # stored by a gateway with other egress rules
                    log.error("server %r cannot be served here (%s)", name, exc)
                    self._api.pop(name, None)
                    self._routes.pop(name, None)
        self._published()

    def _published(self) -> None:
        """The servers changed: what the policies read of them, and who follows them."""
        self._access.publish("servers", {n: s.access for n, s in self._api.items()})
        self._destinations.publish("servers", {n: _egress(s) for n, s in self._api.items()})
        if self.changed is not None:  # a virtual endpoint's member may have come or gone
            self.changed()

    async def sync(self) -> None:
        """Catch up with changes other gateways (or processes) made, if any."""
        await self._mirror.sync()

    def _install(self, server: ServerIn) -> None:
        upstream = UpstreamConfig(name=server.name, url=str(server.url),
                                  timeout_s=server.timeout_s,
                                  total_timeout_s=server.total_timeout_s,
                                  zones=list(server.zones), era=server.era,
                                  access=server.access)
        _egress(server)  # raises ValueError if it may not be served
        self._routes[server.name] = UpstreamRoute.from_config(upstream)
        self._api[server.name] = server

    def _out(self, name: str) -> ServerOut:
        if name in self._config:
            u = self._config[name]
            return ServerOut(name=u.name, url=u.url, timeout_s=u.timeout_s,
                             total_timeout_s=u.total_timeout_s, zones=list(u.zones), era=u.era,
                             source="config", mcp_url=f"{self._public_url}/mcp/{u.name}",
                             access=u.access)
        s = self._api[name]
        return ServerOut(name=s.name, url=str(s.url), timeout_s=s.timeout_s,
                         total_timeout_s=s.total_timeout_s, zones=list(s.zones), era=s.era,
                         source="api", mcp_url=f"{self._public_url}/mcp/{s.name}",
                         access=s.access)

    def scopes_of(self, name: str) -> list[str] | None:
        """The allow_scopes of a server registered through the API; None if there is none."""
        server = self._api.get(name)
        return None if server is None else list(server.access.allow_scopes)

    async def list(self, limit: int | None = None, offset: int = 0) -> list[ServerOut]:
        """Every server by name, or the `limit` from the `offset`-th on."""
        await self.sync()
        names = sorted({*self._config, *self._api})[offset:]
        return [self._out(n) for n in (names if limit is None else names[:limit])]

    async def get(self, name: str) -> ServerOut:
        await self.sync()
        if name not in self._config and name not in self._api:
            raise NotFound(f"server '{name}' not found")
        return self._out(name)

    async def names(self) -> set[str]:
        await self.sync()
        return {*self._config, *self._api}

    # -- writing -------------------------------------------------------------------------------

    async def create(self, server: ServerIn) -> ServerOut:
        if server.name in self._config:
            raise Conflict(f"server '{server.name}' already exists")
        if self.reserved(server.name):  # a virtual endpoint's (proxy.virtual.registry)
            raise Conflict(f"'{server.name}' is the name of a virtual endpoint")
        self._validate(server)
        return await self._write(server.name, self._insert_row, server)

    async def replace(self, name: str, server: ServerIn) -> ServerOut:
        self._config_is_read_only(name)
        self._validate(server)
        return await self._write(name, self._update_row, name, lambda _old: server)

    async def patch(self, name: str, changes: dict[str, Any]) -> ServerOut:
        """Merge `changes` (a validated ServerPatch, dumped without its unset fields) into the
        stored server, read and written in one transaction: concurrent patches all land."""
        self._config_is_read_only(name)

        def merged(old: ServerIn) -> ServerIn:
            try:
                server = ServerIn.model_validate({**old.model_dump(mode="json"), **changes})
            except ValidationError as exc:
                raise Invalid.from_pydantic(exc) from None
            self._validate(server)
            return server

        return await self._write(name, self._update_row, name, merged)

    async def delete(self, name: str) -> None:
        self._config_is_read_only(name)
        async with self._mirror.changing():
            try:
                await self._mirror.run(self._delete_row, name)
            finally:  # deleted, or refused (named by keys, gone already): as it is now
                await self._mirror.catch_up()

    async def _write(self, name: str, fn: Any, *args: Any) -> ServerOut:
        async with self._mirror.changing():
            try:
                server: ServerIn = await self._mirror.run(fn, *args)
            except ApiError:  # taken or gone: another gateway wrote; see what it did
                await self._mirror.catch_up()
                raise
            self._install(server)  # validated before the write: it cannot fail here
            self._published()  # its route and its rules in the same step
            await self._mirror.catch_up()
            return self._out(name)

    def _config_is_read_only(self, name: str) -> None:
        if name in self._config:
            raise BadRequest(f"server '{name}' is defined in the config file, which the "
                             "API cannot change")

    def _validate(self, server: ServerIn) -> None:
        try:
            _egress(server)
        except ValueError as exc:
            raise BadRequest(f"server '{server.name}': {exc}") from None

    def _insert_row(self, server: ServerIn) -> ServerIn:
        return self._rows.insert(server.name, server)

    def _update_row(self, name: str, change: Callable[[ServerIn], ServerIn]) -> ServerIn:
        return self._rows.update(name, change)

    def _delete_row(self, name: str) -> None:
        def unnamed_by_keys(conn: Any) -> None:
            # a key scoped to this server would silently regain access to any later server
            # of the same name: the keys must be edited or revoked first
            keys = [str(key_id) for key_id, endpoints in conn.execute(
                self._database.sql("SELECT id, endpoints FROM api_keys WHERE revoked_at IS NULL"),
                ()).fetchall() if name in orjson.loads(endpoints)]
            if keys:
                raise Conflict(f"server '{name}' is named by API key(s) "
                               f"{', '.join(sorted(keys))}; edit or revoke them first")

        self._rows.delete(name, unnamed_by_keys)



def _egress(server: ServerIn) -> UpstreamEgress:
    """The server's destination, which the egress policy checks; ValueError if its zones
    or URL cannot be served (the API refuses such a server before it is stored)."""
    egress = UpstreamEgress.from_url(server.name, str(server.url), list(server.zones), [])
    validate_upstream_egress(f"upstream {server.name!r}", egress.zones, [], {})
    return egress

