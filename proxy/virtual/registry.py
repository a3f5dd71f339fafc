"""The virtual endpoints the edge serves: the config file's (read-only, `source: config`) and
those created through /api/v1/endpoints (table `endpoints`, `source: api`). Like the server
registry (proxy/servers.py): a write goes to the database first, then into the edge's live
table, so it applies from the next request; the table is a mirror (proxy.mirror) that every
gateway on the database polls by its `endpoints_version` counter. The rules of the API's
endpoints are published for the access policy (proxy.published). A name or alias that collides
is refused (409) with the same line a config file's collision stops start-up with."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from pydantic import ValidationError

from proxy.config import Config, EndpointConfig
from proxy.config.endpoints import config_collision
from proxy.errors import ApiError, BadRequest, Conflict, Invalid, NotFound
from proxy.mirror import Mirrors
from proxy.published import Published
from proxy.servers import Registry
from proxy.storage import db
from proxy.storage.stored import StoredSpecs
from proxy.virtual.route import VirtualRoute
from proxy.virtual.schema import EndpointIn, EndpointOut

log = logging.getLogger("tollhouse.virtual.registry")


class Endpoints:
    def __init__(self, cfg: Config, live: dict[str, VirtualRoute], servers: Registry,
                 mirrors: Mirrors, access: Published[Any],
                 database: db.Target | None = None, *,
                 changed: Callable[[], None] | None = None) -> None:
        self._config = {e.name: e for e in cfg.endpoints}
        self._live = live  # the gateway's table: the config's endpoints are in it already
        self._servers = servers
        self._access = access  # where the rules of the API's endpoints are published
        self._public_url = cfg.server.public_url.rstrip("/")
        self._database = db.resolve(cfg.database.url if database is None else database)
        self._rows = StoredSpecs(self._database, "endpoints", EndpointIn, "endpoint")
        self._api: dict[str, EndpointIn] = {}
        self.changed = changed  # told after each change is applied
        self._mirror = mirrors.mirror(
            "endpoint registry", self._rows.read_version,
            lambda: self._rows.read_all(lambda name: name in self._config), self._apply,
            errors=self._database.errors)
        self._apply(self._mirror.load_now())

    # -- reading and applying ------------------------------------------------------------------

    def _apply(self, endpoints: dict[str, EndpointIn]) -> None:
        for name in [n for n in self._api if n not in endpoints]:
            self._api.pop(name)
            self._live.pop(name, None)
        for name, endpoint in endpoints.items():
            if self._api.get(name) != endpoint:
                self._install(endpoint)
        self._published()

    def _published(self) -> None:
        """The live table changed: its rules are published, and whoever follows the members
        (the merged GET streams, which tell their clients the lists changed) looks again."""
        self._access.publish("endpoints", {n: e.access for n, e in self._api.items()})
        if self.changed is not None:
            self.changed()

    def _install(self, endpoint: EndpointIn) -> None:
        self._live[endpoint.name] = VirtualRoute.from_config(_config(endpoint))
        self._api[endpoint.name] = endpoint

    def rebase(self, cfg: Config) -> None:
        """A reload: the config's endpoints are now `cfg`'s; one of the API the file now
        names is the file's, one it no longer names is read at the next `sync`."""
        self._config = {e.name: e for e in cfg.endpoints}
        for name in [n for n in self._live if n not in self._api]:
            self._live.pop(name)
        self._live.update({e.name: VirtualRoute.from_config(e) for e in cfg.endpoints})
        for name in [n for n in self._api if n in self._config]:
            del self._api[name]
        self._published()
        self._mirror.stale()

    async def sync(self) -> None:
        await self._mirror.sync()

    # -- the API -------------------------------------------------------------------------------

    def _out(self, name: str) -> EndpointOut:
        if name in self._config:
            e = self._config[name]
            return EndpointOut(**vars(e), source="config",
                               mcp_url=f"{self._public_url}/mcp/{e.name}")
        s = self._api[name]
        return EndpointOut(**s.model_dump(), source="api",
                           mcp_url=f"{self._public_url}/mcp/{s.name}")

    def scopes_of(self, name: str) -> list[str] | None:
        """The allow_scopes of an endpoint created through the API; None if there is none."""
        endpoint = self._api.get(name)
        return None if endpoint is None else list(endpoint.access.allow_scopes)

    async def list(self) -> list[EndpointOut]:
        await self.sync()
        return [self._out(n) for n in sorted({*self._config, *self._api})]

    async def get(self, name: str) -> EndpointOut:
        await self.sync()
        if name not in self._config and name not in self._api:
            raise NotFound(f"endpoint '{name}' not found")
        return self._out(name)

    async def create(self, endpoint: EndpointIn) -> EndpointOut:
        if endpoint.name in self._config:
            raise Conflict(f"endpoint '{endpoint.name}' already exists")
        await self._validate(endpoint)
        return await self._write(endpoint.name, self._insert_row, endpoint)

    async def replace(self, name: str, endpoint: EndpointIn) -> EndpointOut:
        self._config_is_read_only(name)
        await self._validate(endpoint)
        return await self._write(name, self._update_row, name, lambda _old: endpoint)

    async def patch(self, name: str, changes: dict[str, Any]) -> EndpointOut:
        self._config_is_read_only(name)
        await self.sync()
        old = self._api.get(name)
        if old is None:
            raise NotFound(f"endpoint '{name}' not found")
        try:
            merged = EndpointIn.model_validate({**old.model_dump(mode="json"), **changes})
        except ValidationError as exc:
            raise Invalid.from_pydantic(exc) from None
        return await self.replace(name, merged)

    async def delete(self, name: str) -> None:
        self._config_is_read_only(name)
        async with self._mirror.changing():
            try:
                await self._mirror.run(self._rows.delete, name)
            finally:
                await self._mirror.catch_up()

    def _config_is_read_only(self, name: str) -> None:
        if name in self._config:
            raise BadRequest(f"endpoint '{name}' is defined in the config file, which the "
                             "API cannot change")

    async def _validate(self, endpoint: EndpointIn) -> None:
        """The start-up checks (409 on a collision), against the servers as they are now."""
        clash = config_collision(endpoint.name, list(endpoint.members), endpoint.separator,
                                 endpoint.aliases, await self._servers.names())
        if clash is not None:
            raise Conflict(clash)

    async def _write(self, name: str, fn: Any, *args: Any) -> EndpointOut:
        async with self._mirror.changing():
            try:
                endpoint: EndpointIn = await self._mirror.run(fn, *args)
            except ApiError:
                await self._mirror.catch_up()
                raise
            self._install(endpoint)
            self._published()  # its route and its rules in the same step
            await self._mirror.catch_up()
            return self._out(name)

    def _insert_row(self, endpoint: EndpointIn) -> EndpointIn:
        return self._rows.insert(endpoint.name, endpoint)

    def _update_row(self, name: str, change: Callable[[EndpointIn], EndpointIn]) -> EndpointIn:
        return self._rows.update(name, change)


def _config(endpoint: EndpointIn) -> EndpointConfig:
    """The endpoint as the config would have it: EndpointIn has EndpointConfig's fields."""
    return EndpointConfig(**dict(endpoint))
