"""Per-caller upstreams: the step that turns a templated route (proxy.config.template) into
the concrete route of this caller's own server, before anything is sent.

A resolved route is an ordinary `UpstreamRoute` under the endpoint's name, with its own URL,
its own `state_key` (so era verdicts, bridge sessions and remembered tool lists are per
resolved upstream, never shared between callers' servers), its own egress entry (checked and
pinned like a configured upstream's, `proxy.destinations.Destinations.add_resolved`) and its own
connection pool. At most `max_resolved` are kept per templated upstream; the least recently
used is dropped with its egress entry, and its pool closed once no response holds it.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, Protocol

import httpx

from proxy.auth.people import StoreDown
from proxy.auth.principal import Principal
from proxy.config.template import SUBJECT, Missing
from proxy.destinations import Destinations
from proxy.errors import StoreUnavailable, UpstreamFailure
from proxy.people.live import LiveUsers, UsersTable
from proxy.upstream.client import UpstreamRoute

Spawn = Callable[[Coroutine[Any, Any, None]], None]


class NoUpstreamForCaller(UpstreamFailure):
    """-32000: the caller's values fill no URL (absent, or not matching the pattern).
    Audited with the placeholder and why; the value itself is the caller's and is not."""

    message = "no upstream for this caller"
    expose_detail = False
    upstream_kind = "no_upstream"

    def __init__(self, missing: Missing) -> None:
        super().__init__(missing.reason)


class Attributes(Protocol):
    """A person's stored attributes (`/api/v1/users/{name}`), for placeholders no claim fills."""

    async def attributes(self, principal: Principal) -> Mapping[str, str]: ...


class PeopleAttributes:
    """A person's attributes as the users table holds them now (through `LiveUsers`: one
    read per person per 30 s, a change through this process's API at once)."""

    def __init__(self, accounts: UsersTable) -> None:
        self._live = LiveUsers(accounts)

    async def attributes(self, principal: Principal) -> Mapping[str, str]:
        try:
            user = await self._live.current(principal.issuer, principal.subject)
        except StoreDown:
            raise StoreUnavailable("the users table") from None
        return dict(user.attributes) if user is not None else {}


class Tenants:
    def __init__(self, destinations: Destinations | None,
                 pool: Callable[[], httpx.AsyncBaseTransport | None], spawn: Spawn,
                 people: Attributes | None = None) -> None:
        self._destinations = destinations
        self._pool = pool  # a new pool per resolved origin (None: every route shares one)
        self._spawn = spawn
        self.people = people
        # by endpoint: the templated route the table was made from, and its resolved routes
        self._resolved: dict[str, tuple[UpstreamRoute, OrderedDict[str, UpstreamRoute]]] = {}
        self._closing: list[httpx.AsyncBaseTransport] = []

    async def resolve(self, route: UpstreamRoute, principal: Principal) -> UpstreamRoute:
        """This caller's own route; `route` itself when it is not templated."""
        template = route.template
        if template is None:
            return route
        values: dict[str, str | None] = {}
        attributes: Mapping[str, str] | None = None
        for name, placeholder in template.placeholders.items():
            value = principal.subject if name == SUBJECT else principal.claim(placeholder.claim)
            if value is None and name != SUBJECT and self.people is not None:
                if attributes is None:
                    attributes = await self.people.attributes(principal)
                value = attributes.get(placeholder.attribute)
            values[name] = value
        url = template.fill(values)
        if isinstance(url, Missing):
            raise NoUpstreamForCaller(url)
        owner, table = self._resolved.get(route.name, (None, None))
        if owner is not route or table is None:  # first use, or a reload replaced the route
            if table is not None:
                for old in table.values():
                    self._drop(old)
            table = OrderedDict()
            self._resolved[route.name] = (route, table)
        hit = table.get(url)
        if hit is not None:
            table.move_to_end(url)
            return hit
        resolved = self._build(route, url)
        table[url] = resolved
        while len(table) > route.max_resolved:
            _, old = table.popitem(last=False)
            self._drop(old)
        return resolved

    def _build(self, route: UpstreamRoute, url: str) -> UpstreamRoute:
        parsed = httpx.URL(url)  # the template's checks make this parse: no caller input fails it
        port = parsed.port or (443 if parsed.scheme == "https" else 80)
        origin = f"{parsed.scheme}://{parsed.netloc.decode('ascii')}"
        audience = url if route.identity_audience == route.url_text else route.identity_audience
        resolved = dataclasses.replace(
            route, url=parsed, url_text=url, state_key=f"{route.name} {url}", template=None,
            origin=origin, identity_audience=audience, transport=self._pool())
        if self._destinations is not None:
            self._destinations.add_resolved(resolved.dial_key, parsed.host, port, route.zones)
        return resolved

    def _drop(self, route: UpstreamRoute) -> None:
        if self._destinations is not None:
            self._destinations.discard(route.dial_key)
        if route.transport is not None:
            self._closing.append(route.transport)
        still = []
        for transport in self._closing:  # closed once no response holds a connection of it
            if getattr(transport, "open_responses", 0):
                still.append(transport)
            else:
                self._spawn(transport.aclose())
        self._closing = still

    def resolved_count(self) -> int:
        return sum(len(t) for _, t in self._resolved.values())

    async def aclose(self) -> None:
        for _, table in self._resolved.values():
            for route in table.values():
                if route.transport is not None:
                    await route.transport.aclose()
        for transport in self._closing:
            await transport.aclose()
        self._resolved.clear()
        self._closing = []
