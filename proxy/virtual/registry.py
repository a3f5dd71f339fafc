"""The virtual endpoints the edge serves: the config file's (read-only, `source: config`) and
those created through /api/v1/endpoints (table `endpoints`, `source: api`). Like the server
registry (proxy/registry.py): a write goes to the database first, then into the edge's live
table, so it applies from the next request; every gateway on the database polls the
`endpoints_version` counter (`watch`) and reloads what changed. A name or alias that collides
is refused (409) with the same line a config file's collision stops start-up with."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from pydantic import ValidationError

from policies.access import Access
from proxy import db
from proxy.config import Config, EndpointConfig
from proxy.errors import ApiError, BadRequest, Conflict, Invalid, NotFound
from proxy.registry import POLL_S, Registry, _access_config
from proxy.schema import AccessIn
from proxy.stored import StoredSpecs
from proxy.virtual.naming import config_collision
from proxy.virtual.route import VirtualRoute
from proxy.virtual.schema import EndpointIn, EndpointOut

log = logging.getLogger("tollhouse.virtual.registry")


class Endpoints:
    def __init__(self, cfg: Config, live: dict[str, VirtualRoute], servers: Registry,
                 access: Access | None, database: db.Target | None = None, *,
                 poll_s: float = POLL_S,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        self._config = {e.name: e for e in cfg.endpoints}
        self._live = live  # the gateway's table: the config's endpoints are in it already
        self._servers = servers
        self._access = access
        self._public_url = cfg.server.public_url.rstrip("/")
        self._poll_s = poll_s
        self._sleep = sleep
        self._database = db.resolve(cfg.database.url if database is None else database)
        self._rows = StoredSpecs(self._database, "endpoints", EndpointIn, "endpoint")
        self._db = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tollhouse-endpoints")
        self._api: dict[str, EndpointIn] = {}
        self._lock = asyncio.Lock()
        self._version = -1
        self._watch: asyncio.Task[None] | None = None
        self.changed: Callable[[], None] | None = None  # told after each change is applied
        self._apply(*self._read_all())

    # -- reading and applying ------------------------------------------------------------------

    def _read_all(self) -> tuple[int, dict[str, EndpointIn]]:
        return self._rows.read_all(lambda name: name in self._config)

    def _read_version(self) -> int:
        return self._rows.read_version()

    def _apply(self, version: int, endpoints: dict[str, EndpointIn]) -> None:
        for name in [n for n in self._api if n not in endpoints]:
            self._api.pop(name)
            self._live.pop(name, None)
            if self._access is not None:
                self._access.set(name, None)
        for name, endpoint in endpoints.items():
            if self._api.get(name) != endpoint:
                self._install(endpoint)
        self._version = version
        self._changed()

    def _changed(self) -> None:
        """The live table changed: whoever follows the members (the merged GET streams,
        which tell their clients the lists changed) looks again."""
        if self.changed is not None:
            self.changed()

    def _install(self, endpoint: EndpointIn) -> None:
        cfg = _config(endpoint)
        if self._access is not None:
            self._access.set(cfg.name, cfg.access)
        self._live[cfg.name] = VirtualRoute.from_config(cfg)
        self._api[cfg.name] = endpoint

    def rebase(self, cfg: Config, access: Access | None) -> None:
        """A reload: the config's endpoints are now `cfg`'s (their rules are in `access`,
        built from it), and every endpoint of the API is installed again in the new access
        table, as it is (else its rules would be gone: nothing would be hidden any more)."""
        self._config = {e.name: e for e in cfg.endpoints}
        for name in [n for n in self._live if n not in self._api]:
            self._live.pop(name)
        self._live.update({e.name: VirtualRoute.from_config(e) for e in cfg.endpoints})
        self._access = access
        endpoints, self._api = self._api, {}
        for name, endpoint in endpoints.items():
            if name not in self._config:
                self._install(endpoint)
        self._version = -1
        self._changed()

    async def sync(self) -> None:
        async with self._lock:
            if await self._run(self._read_version) != self._version:
                self._apply(*await self._run(self._read_all))

    def start(self) -> None:
        self._watch = asyncio.get_running_loop().create_task(self._poll())

    async def _poll(self) -> None:
        while True:
            await self._sleep(self._poll_s)
            try:
                await self.sync()
            except self._database.errors as exc:
                log.warning("endpoint registry: cannot read the database (%s)", exc)

    async def close(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
            await asyncio.wait({self._watch}, timeout=5)
        # a read still running gives its connection back before the database closes
        await asyncio.wait_for(asyncio.to_thread(self._db.shutdown, True), timeout=5)

    # -- the API -------------------------------------------------------------------------------

    def _out(self, name: str) -> EndpointOut:
        if name in self._config:
            e = self._config[name]
            return EndpointOut(name=e.name, members=list(e.members), separator=e.separator,
                               list_timeout_s=e.list_timeout_s,
                               total_timeout_s=e.total_timeout_s, aliases=dict(e.aliases),
                               access=AccessIn.model_validate(dataclasses.asdict(e.access)),
                               source="config", mcp_url=f"{self._public_url}/mcp/{e.name}")
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
        async with self._lock:
            try:
                await self._run(self._delete_row, name)
            finally:
                self._apply(*await self._run(self._read_all))

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
        async with self._lock:
            try:
                endpoint: EndpointIn = await self._run(fn, *args)
            except ApiError:
                self._apply(*await self._run(self._read_all))
                raise
            self._install(endpoint)
            self._apply(*await self._run(self._read_all))
            return self._out(name)

    async def _run(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._db, fn, *args)

    def _insert_row(self, endpoint: EndpointIn) -> EndpointIn:
        return self._rows.insert(endpoint.name, endpoint)

    def _update_row(self, name: str, change: Callable[[EndpointIn], EndpointIn]) -> EndpointIn:
        return self._rows.update(name, change)

    def _delete_row(self, name: str) -> None:
        self._rows.delete(name)


def _config(endpoint: EndpointIn) -> EndpointConfig:
    return EndpointConfig(name=endpoint.name, members=list(endpoint.members),
                          separator=endpoint.separator, list_timeout_s=endpoint.list_timeout_s,
                          aliases=dict(endpoint.aliases),
                          access=_access_config(endpoint.access),
                          total_timeout_s=endpoint.total_timeout_s)
