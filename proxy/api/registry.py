"""The registry of upstream servers: those the config file declares (read-only, `source:
config`) and those created through the API (stored, `source: api`). A change takes effect on
the next request: the edge's route table is swapped entry by entry, so a call in flight keeps
the route it started with. Servers registered through the API may be dialled only in the zones
they name (default `remote`), checked by the egress policy like every other upstream."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import orjson

from policies.access import Access
from policies.egress import Egress, UpstreamEgress
from proxy import db
from proxy.api.errors import ApiError
from proxy.api.models import AccessIn, ServerIn, ServerOut
from proxy.config import AccessConfig, Config, ToolProfile, UpstreamConfig
from proxy.upstream import UpstreamRoute


class Registry:
    def __init__(self, cfg: Config, routes: dict[str, UpstreamRoute], egress: Egress,
                 access: Access | None = None, database: db.Target | None = None) -> None:
        self._access = access
        self._public_url = cfg.server.public_url.rstrip("/")
        self._config = {u.name: u for u in cfg.upstreams}
        self._routes = routes
        self._egress = egress
        self._database = db.resolve(cfg.database.url if database is None else database)
        self._db = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tollhouse-registry")
        self._api: dict[str, ServerIn] = {}
        self._lock = asyncio.Lock()
        with self._database.transaction() as conn:
            rows = conn.execute(self._database.sql("SELECT name, spec FROM servers"),
                                ()).fetchall()
        for name, spec in rows:
            server = ServerIn.model_validate(orjson.loads(spec))
            if name not in self._config:
                self._api[name] = server
                self._install(server)

    def _install(self, server: ServerIn) -> None:
        upstream = UpstreamConfig(name=server.name, url=str(server.url),
                                  timeout_s=server.timeout_s,
                                  total_timeout_s=server.total_timeout_s,
                                  zones=list(server.zones), era=server.era)
        self._egress.add(UpstreamEgress.from_url(upstream.name, upstream.url, upstream.zones,
                                                 []))
        if self._access is not None:
            self._access.set(server.name, _access_config(server.access))
        self._routes[server.name] = UpstreamRoute.from_config(upstream)

    def scopes_of(self, name: str) -> list[str] | None:
        """The allow_scopes of a server registered through the API; None if there is none."""
        server = self._api.get(name)
        return None if server is None else list(server.access.allow_scopes)

    def _out(self, name: str) -> ServerOut:
        if name in self._config:
            u = self._config[name]
            return ServerOut(name=u.name, url=u.url, timeout_s=u.timeout_s,
                             total_timeout_s=u.total_timeout_s, zones=list(u.zones), era=u.era,
                             source="config", mcp_url=f"{self._public_url}/mcp/{u.name}",
                             access=AccessIn.model_validate(dataclasses.asdict(u.access)))
        s = self._api[name]
        return ServerOut(name=s.name, url=str(s.url), timeout_s=s.timeout_s,
                         total_timeout_s=s.total_timeout_s, zones=list(s.zones), era=s.era,
                         source="api", mcp_url=f"{self._public_url}/mcp/{s.name}",
                         access=s.access)

    def list(self) -> list[ServerOut]:
        return [self._out(n) for n in sorted({*self._config, *self._api})]

    def get(self, name: str) -> ServerOut:
        if name not in self._config and name not in self._api:
            raise ApiError(404, f"server '{name}' not found")
        return self._out(name)

    async def create(self, server: ServerIn) -> ServerOut:
        async with self._lock:
            if server.name in self._config or server.name in self._api:
                raise ApiError(409, f"server '{server.name}' already exists")
            await self._store(server, created=True)
            return self._out(server.name)

    async def replace(self, name: str, server: ServerIn) -> ServerOut:
        async with self._lock:
            self._writable(name)
            await self._store(server, created=False)
            return self._out(name)

    async def delete(self, name: str) -> None:
        async with self._lock:
            self._writable(name)
            await self._run(self._delete_row, name)
            del self._api[name]
            self._routes.pop(name, None)
            self._egress.discard(name)
            if self._access is not None:
                self._access.set(name, None)

    def current(self, name: str) -> ServerIn:
        self._writable(name)
        return self._api[name]

    def _writable(self, name: str) -> None:
        if name in self._config:
            raise ApiError(400, f"server '{name}' is defined in the config file, which the API "
                                "cannot change")
        if name not in self._api:
            raise ApiError(404, f"server '{name}' not found")

    async def _store(self, server: ServerIn, created: bool) -> None:
        try:
            self._egress.add(UpstreamEgress.from_url(server.name, str(server.url),
                                                     list(server.zones), []))
        except ValueError as exc:
            raise ApiError(400, f"server '{server.name}': {exc}") from None
        await self._run(self._write_row, server, created)
        self._api[server.name] = server
        self._install(server)

    async def _run(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._db, fn, *args)

    def _write_row(self, server: ServerIn, created: bool) -> None:
        now = time.time()
        spec = server.model_dump_json()
        sql = self._database.sql
        with self._database.transaction() as conn:
            if created:
                conn.execute(sql("INSERT INTO servers (name, spec, created_at, updated_at) "
                                 "VALUES (?, ?, ?, ?)"), (server.name, spec, now, now))
            else:
                conn.execute(sql("UPDATE servers SET spec = ?, updated_at = ? WHERE name = ?"),
                             (spec, now, server.name))

    def _delete_row(self, name: str) -> None:
        with self._database.transaction() as conn:
            conn.execute(self._database.sql("DELETE FROM servers WHERE name = ?"), (name,))

    def close(self) -> None:
        self._db.shutdown(wait=False)


def _access_config(access: AccessIn) -> AccessConfig:
    data = access.model_dump()
    groups = {g: ToolProfile(**p) for g, p in data.pop("group_tools").items()}
    return AccessConfig(**data, group_tools=groups)
